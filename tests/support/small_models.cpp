#include "support/small_models.h"

namespace pipetrain::testing {

torch::nn::Sequential tanh_mlp(const std::vector<int64_t>& widths) {
  torch::nn::Sequential mlp;
  for (size_t i = 1; i < widths.size(); ++i) {
    if (i > 1) mlp->push_back(torch::nn::Tanh());
    mlp->push_back(torch::nn::Linear(widths[i - 1], widths[i]));
  }
  return mlp;
}

SgdModule::SgdModule(torch::nn::Sequential layers, double learning_rate, double momentum)
    : Module(std::move(layers)), learning_rate_(learning_rate), momentum_(momentum) {}

OptimizerConfig SgdModule::configure_optimizers() {
  return std::make_unique<torch::optim::SGD>(
      parameters(), torch::optim::SGDOptions(learning_rate_).momentum(momentum_));
}

at::Tensor MseRegression::training_step(const Batch& batch, int64_t) {
  auto loss = torch::mse_loss(forward(batch.data), batch.target);
  log("train_loss", loss);
  return loss;
}

nn::DecoderConfig tiny_decoder_config(int64_t vocab_size, int64_t n_layer, int64_t block_size) {
  nn::DecoderConfig config;
  config.vocab_size = vocab_size;
  config.n_layer = n_layer;
  config.n_embd = 32;
  config.n_head = 4;
  config.n_kv_head = 2;
  config.intermediate_size = 48;
  config.block_size = block_size;
  return config;
}

nn::DecoderConfig tiny_llama3_config(int64_t vocab_size, int64_t n_layer, int64_t block_size) {
  nn::DecoderConfig config = tiny_decoder_config(vocab_size, n_layer, block_size);
  config.tie_word_embeddings = true;
  config.rope.theta(500000).rope_type("llama3").factor(32).original_max_position_embeddings(4);
  return config;
}

nn::DecoderConfig tiny_qwen3_config(int64_t vocab_size, int64_t n_layer, int64_t block_size) {
  nn::DecoderConfig config = tiny_decoder_config(vocab_size, n_layer, block_size);
  config.n_kv_head = 1;  // multi-query
  config.head_dim = 16;  // not n_embd / n_head
  config.qk_norm = true;
  config.tie_word_embeddings = false;
  config.rms_norm_eps = 1e-6;
  config.rope = nn::RotaryEmbeddingOptions().theta(1e6);
  return config;
}

nn::Gpt2Config tiny_gpt2_config(int64_t vocab_size, int64_t n_layer, int64_t block_size) {
  nn::Gpt2Config config;
  config.vocab_size = vocab_size;
  config.n_layer = n_layer;
  config.n_head = 2;
  config.n_embd = 16;
  config.block_size = block_size;
  return config;
}

}  // namespace pipetrain::testing
