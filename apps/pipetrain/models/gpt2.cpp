#include "models/gpt2.h"

#include "models/hf_gpt2.h"
#include "models/layer_weights.h"
#include "models/token_embedding.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>

#include <pipetrain/checkpoint_io.h>
#include <pipetrain/cross_entropy.h>
#include <pipetrain/layer_norm.h>
#include <pipetrain/nn/attention.h>
#include <pipetrain/nn/mlp.h>
#include <pipetrain/trainer.h>

namespace pipetrain::cli {
namespace {

// torch::nn::LayerNorm (its parameters, names and initialisation) whose forward is
// pipetrain::layer_norm, on a GPU pipetrain's kernels. Every LayerNorm of GPT-2 feeds a matmul
// (c_attn, c_fc, the LM head), so under autocast it returns autocast's dtype. (A block's two
// call pipetrain's residual forms on their parameters instead.)
class Gpt2LayerNormImpl : public torch::nn::LayerNormImpl {
 public:
  explicit Gpt2LayerNormImpl(int64_t width)
      : LayerNormImpl(torch::nn::LayerNormOptions(std::vector<int64_t>{width})) {}
  at::Tensor forward(const at::Tensor& x) {
    return pipetrain::layer_norm(x, weight, bias, options.eps(),
                                 pipetrain::LayerNormOutput::kAutocastDtype);
  }
};
TORCH_MODULE(Gpt2LayerNorm);

// GPT-2's names (those of its released weights): one c_attn projection to q, k and v, c_proj
// after; biases everywhere.
nn::CausalSelfAttentionOptions attention_options(const Gpt2Config& config) {
  return nn::CausalSelfAttentionOptions(config.n_embd, config.n_head)
      .bias(true)
      .fused_qkv(true)
      .dropout(config.dropout);
}

class Gpt2BlockImpl : public torch::nn::Module {
 public:
  explicit Gpt2BlockImpl(const Gpt2Config& config)
      : ln_1(register_module("ln_1", Gpt2LayerNorm(config.n_embd))),
        attn(register_module("attn", nn::CausalSelfAttention(attention_options(config)))),
        ln_2(register_module("ln_2", Gpt2LayerNorm(config.n_embd))),
        mlp(register_module("mlp", nn::GeluMlp(nn::GeluMlpOptions(config.n_embd, 4 * config.n_embd)
                                                   .dropout(config.dropout)))) {}

  at::Tensor forward(const at::Tensor& x) {
    // ln_1(x) beside x, then h = x + attn(ln_1(x)) and ln_2(h) in one pass; each LayerNorm's
    // backward adds the residual stream's gradient (ln_1 and ln_2 hold the parameters).
    constexpr auto to_matmul = pipetrain::LayerNormOutput::kAutocastDtype;
    const auto first =
        pipetrain::residual_layer_norm(x, ln_1->weight, ln_1->bias, ln_1->options.eps(), to_matmul);
    const auto second =
        pipetrain::add_layer_norm(first.residual, attn(first.normalised), ln_2->weight, ln_2->bias,
                                  ln_2->options.eps(), to_matmul);
    return second.residual + mlp(second.normalised);
  }

  Gpt2LayerNorm ln_1;
  nn::CausalSelfAttention attn;
  Gpt2LayerNorm ln_2;
  nn::GeluMlp mlp;
};
TORCH_MODULE(Gpt2Block);

// The LM head: the token embedding's tensor itself, so the two stay one parameter; or, on a
// process without the embedding (built per rank), a matrix of its own tied to it by name.
class Gpt2HeadImpl : public torch::nn::Module {
 public:
  explicit Gpt2HeadImpl(const torch::nn::Embedding& wte)
      : weight(register_parameter("weight", wte->weight)) {}
  Gpt2HeadImpl(int64_t vocab_size, int64_t n_embd)
      : weight(register_parameter("weight", torch::empty({vocab_size, n_embd}))) {}
  at::Tensor forward(const at::Tensor& x) { return torch::nn::functional::linear(x, weight); }
  at::Tensor weight;
};
TORCH_MODULE(Gpt2Head);

void validate(const Gpt2Config& config) {
  auto require = [](bool ok, const std::string& message) {
    if (!ok) throw std::invalid_argument("GPT-2: " + message);
  };
  require(config.n_layer > 0, "n_layer (--n-layer) must be positive");
  require(config.vocab_size > 0, "vocab_size (--vocab-size) must be positive");
  require(config.block_size > 0, "block_size (--block-size) must be positive");
  require(config.n_head > 0 && config.n_embd > 0 && config.n_embd % config.n_head == 0,
          "n_embd (--n-embd " + std::to_string(config.n_embd) +
              ") must be a positive multiple of n_head (--n-head " + std::to_string(config.n_head) +
              ")");
  require(config.dropout >= 0 && config.dropout < 1, "dropout must be in [0, 1)");
}

}  // namespace

Gpt2Config gpt2_preset(const std::string& size) {
  Gpt2Config config;
  if (size == "124M") {
    config.n_layer = 12, config.n_head = 12, config.n_embd = 768;
  } else if (size == "350M") {
    config.n_layer = 24, config.n_head = 16, config.n_embd = 1024;
  } else if (size == "774M") {
    config.n_layer = 36, config.n_head = 20, config.n_embd = 1280;
  } else if (size == "1558M") {
    config.n_layer = 48, config.n_head = 25, config.n_embd = 1600;
  } else {
    throw std::invalid_argument("--model-size " + size + ": use 124M, 350M, 774M or 1558M");
  }
  return config;
}

double gpt2_flops_per_token(const Gpt2Config& config) {
  const double layers = static_cast<double>(config.n_layer),
               width = static_cast<double>(config.n_embd);
  // Per block: c_attn 3C^2 + 3C, c_proj C^2 + C, c_fc 4C^2 + 4C, mlp.c_proj 4C^2 + C, two
  // LayerNorms 4C; then wte and ln_f.
  const double parameters = static_cast<double>(config.vocab_size) * width +
                            layers * (12 * width * width + 13 * width) + 2 * width;
  return 6 * parameters + 12 * layers * width * static_cast<double>(config.block_size);
}

torch::nn::Sequential make_gpt2(const Gpt2Config& config) {
  validate(config);
  torch::NoGradGuard no_grad;
  torch::nn::Sequential gpt2;
  TokenPositionEmbedding embedding(
      TokenPositionEmbeddingOptions{"GPT-2", config.vocab_size, config.block_size, config.n_embd,
                                    config.dropout, "wte", "wpe", "drop"});
  gpt2->push_back(embedding);
  for (int64_t i = 0; i < config.n_layer; ++i) gpt2->push_back(Gpt2Block(config));
  gpt2->push_back(Gpt2LayerNorm(config.n_embd));
  gpt2->push_back(Gpt2Head(embedding->token()));
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  const std::string final_norm = std::to_string(config.n_layer + 1) + ".";
  std::set<const void*> drawn;  // the head's tensor is wte's: drawn once, with it
  for (auto& item : gpt2->named_parameters()) {
    const std::string& name = item.key();
    auto& tensor = item.value();
    const auto ends_with = [&](const std::string& suffix) {
      return name.size() >= suffix.size() &&
             name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (!drawn.insert(tensor.data_ptr()).second) continue;
    if (name.find(".ln_") != std::string::npos || name.rfind(final_norm, 0) == 0) {
      continue;  // LayerNorms: weight 1, bias 0, LibTorch's defaults already
    }
    if (ends_with(".bias")) {
      tensor.zero_();
    } else if (ends_with("c_proj.weight")) {
      tensor.normal_(0, residual_std);
    } else {
      tensor.normal_(0, 0.02);
    }
  }
  return gpt2;
}

namespace {

// nanoGPT's initialisation of one layer's parameters (`names` as the layer has them): LayerNorms
// 1 and 0 (LibTorch's defaults), biases 0, the projections into the residual stream (c_proj)
// N(0, 0.02 / sqrt(2 n_layer)), everything else N(0, 0.02).
void initialise(torch::nn::Module& layer, const Gpt2Config& config) {
  torch::NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  for (auto& item : layer.named_parameters()) {
    const std::string& name = item.key();
    const auto ends_with = [&](const std::string& suffix) {
      return name.size() >= suffix.size() &&
             name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (name.rfind("ln_", 0) == 0 || name.find(".ln_") != std::string::npos) continue;
    if (ends_with("bias")) {
      item.value().zero_();
    } else if (ends_with("c_proj.weight")) {
      item.value().normal_(0, residual_std);
    } else {
      item.value().normal_(0, 0.02);
    }
  }
}

// Each layer built and initialised on its own, then, from `init_from` (a Hugging Face GPT-2
// folder, or ""), given that layer's tensors.
std::vector<LayerSpec> gpt2_layers(const Gpt2Config& config, const std::string& init_from) {
  validate(config);
  auto read_into = [config, init_from](torch::nn::AnyModule layer, int64_t index) {
    if (init_from.empty()) return layer;
    const std::string prefix = std::to_string(index) + ".";
    load_layer_weights(
        layer, index,
        read_hf_gpt2_weights(init_from, config,
                             [&](const std::string& name) { return name.rfind(prefix, 0) == 0; }),
        init_from + "/model.safetensors");
    return layer;
  };
  const int64_t n = config.n_layer;
  std::vector<LayerSpec> layers;
  layers.push_back(layer([config, read_into] {
    TokenPositionEmbedding embedding(
        TokenPositionEmbeddingOptions{"GPT-2", config.vocab_size, config.block_size, config.n_embd,
                                      config.dropout, "wte", "wpe", "drop"});
    initialise(*embedding, config);
    return read_into(torch::nn::AnyModule(embedding), 0);
  }));
  for (int64_t i = 1; i <= n; ++i) {
    layers.push_back(layer([config, read_into, i] {
      Gpt2Block block(config);
      initialise(*block, config);
      return read_into(torch::nn::AnyModule(block), i);
    }));
  }
  layers.push_back(layer([config, read_into, n] {
    return read_into(torch::nn::AnyModule(Gpt2LayerNorm(config.n_embd)), n + 1);
  }));
  // The head: the embedding's tensor where this process holds it, else a copy tied by name.
  layers.push_back(layer([config] { return Gpt2Head(config.vocab_size, config.n_embd); },
                         config.vocab_size * config.n_embd)
                       .tie("weight", "0.wte.weight", [](const torch::nn::Sequential& built) {
                         return Gpt2Head(built->ptr<TokenPositionEmbeddingImpl>(0)->token());
                       }));
  return layers;
}

}  // namespace

Gpt2Model::Gpt2Model(const Gpt2Config& config, double lr)
    : Gpt2Model(config, LanguageModelOptions().lr(lr)) {}

Gpt2Model::Gpt2Model(const Gpt2Config& config, LanguageModelOptions options,
                     const std::string& init_from)
    : LanguageModel(gpt2_layers(config, init_from), std::move(options)) {}

void PerplexityLogger::on_validation_end(Trainer& trainer, Module&) {
  const auto loss = trainer.callback_metrics().find("val_loss");
  if (loss == trainer.callback_metrics().end()) return;
  // The row of the validation itself: its epoch and step.
  trainer.log_metrics({{"val_ppl", std::exp(loss->second)},
                       {"epoch", static_cast<double>(trainer.current_epoch())}},
                      std::max<int64_t>(trainer.global_step() - 1, 0));
}

}  // namespace pipetrain::cli
