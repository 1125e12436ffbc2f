#include "pipetrain/nn/gpt2.h"

#include <torch/torch.h>

#include <cmath>
#include <sstream>
#include <stdexcept>

#include <pipetrain/layer_norm.h>

namespace pipetrain::nn {

void check_gpt2_config(const Gpt2Config& config) {
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

Gpt2EmbeddingImpl::Gpt2EmbeddingImpl(const Gpt2EmbeddingOptions& options_)
    : options(options_),
      wte(register_module("wte",
                          Embedding(EmbeddingOptions(options_.vocab_size(), options_.n_embd())))),
      wpe(register_module("wpe",
                          Embedding(EmbeddingOptions(options_.block_size(), options_.n_embd())))),
      drop_(register_module("drop", torch::nn::Dropout(options_.dropout()))) {}

at::Tensor Gpt2EmbeddingImpl::forward(const at::Tensor& ids, const at::Tensor& positions) {
  if (ids.dim() != 2) {
    std::ostringstream message;
    message << "GPT-2 takes token ids of shape [batch, time], got a tensor of shape "
            << ids.sizes();
    throw std::invalid_argument(message.str());
  }
  const int64_t time = ids.size(1);
  if (positions.defined()) return drop_(wte(ids) + wpe(positions));
  if (time > options.block_size()) {
    throw std::invalid_argument("a sequence of " + std::to_string(time) +
                                " tokens is longer than GPT-2's block size " +
                                std::to_string(options.block_size()) + " (--block-size)");
  }
  // [T, C], broadcast over the rows.
  return drop_(wte(ids) + wpe(torch::arange(time, ids.options().dtype(torch::kInt64))));
}

LayerNormImpl::LayerNormImpl(int64_t width)
    : torch::nn::LayerNormImpl(torch::nn::LayerNormOptions(std::vector<int64_t>{width})) {}

at::Tensor LayerNormImpl::forward(const at::Tensor& x) {
  return layer_norm(x, weight, bias, options.eps(), LayerNormOutput::kAutocastDtype);
}

namespace {

// GPT-2's names (those of its released weights): one c_attn projection to q, k and v, c_proj
// after; biases everywhere; positions are the embedding's, so no rotation.
CausalSelfAttentionOptions attention_options(const Gpt2Config& config) {
  return CausalSelfAttentionOptions(config.n_embd, config.n_head)
      .bias(true)
      .fused_qkv(true)
      .dropout(config.dropout);
}

}  // namespace

Gpt2BlockImpl::Gpt2BlockImpl(const Gpt2Config& config)
    : ln_1(register_module("ln_1", LayerNorm(config.n_embd))),
      attn(register_module("attn", CausalSelfAttention(attention_options(config)))),
      ln_2(register_module("ln_2", LayerNorm(config.n_embd))),
      mlp(register_module(
          "mlp",
          GeluMlp(GeluMlpOptions(config.n_embd, 4 * config.n_embd).dropout(config.dropout)))) {}

at::Tensor Gpt2BlockImpl::forward(const at::Tensor& x) {
  return forward_with(x, [&](const at::Tensor& normalised) { return attn(normalised); });
}

at::Tensor Gpt2BlockImpl::forward_cached(const at::Tensor& x, KVCache::Layer& cache,
                                         const CachedStep& step) {
  return forward_with(x, [&](const at::Tensor& normalised) {
    return attn->forward_cached(normalised, cache, step);
  });
}

template <typename Attend>
at::Tensor Gpt2BlockImpl::forward_with(const at::Tensor& x, const Attend& attend) {
  // ln_1(x) beside x, then h = x + attn(ln_1(x)) and ln_2(h) in one pass; each LayerNorm's
  // backward adds the residual stream's gradient (ln_1 and ln_2 hold the parameters).
  constexpr auto to_matmul = LayerNormOutput::kAutocastDtype;
  const auto first =
      residual_layer_norm(x, ln_1->weight, ln_1->bias, ln_1->options.eps(), to_matmul);
  const auto second = add_layer_norm(first.residual, attend(first.normalised), ln_2->weight,
                                     ln_2->bias, ln_2->options.eps(), to_matmul);
  return second.residual + mlp(second.normalised);
}

namespace {

// GPT-2's initialisation of one layer's parameters (`names` as the layer has them): LayerNorms 1
// and 0 (LibTorch's defaults), biases 0, the projections into the residual stream (c_proj)
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
    if (name.rfind("ln_", 0) == 0) continue;
    if (ends_with("bias")) {
      item.value().zero_();
    } else if (ends_with("c_proj.weight")) {
      item.value().normal_(0, residual_std);
    } else {
      item.value().normal_(0, 0.02);
    }
  }
}

// The makers both builders share: each layer built, then drawn.
Gpt2Embedding make_embedding(const Gpt2Config& config) {
  Gpt2Embedding embedding(Gpt2EmbeddingOptions(config.vocab_size, config.block_size, config.n_embd)
                              .dropout(config.dropout));
  initialise(*embedding, config);
  return embedding;
}

Gpt2Block make_block(const Gpt2Config& config) {
  Gpt2Block block(config);
  initialise(*block, config);
  return block;
}

// The head on wte's tensor, from the embedding in layer 0 of `layers`.
LMHead tied_head(const torch::nn::Sequential& layers) {
  return LMHead(layers->ptr<Gpt2EmbeddingImpl>(0)->wte);
}

}  // namespace

torch::nn::Sequential gpt2(const Gpt2Config& config) {
  check_gpt2_config(config);
  torch::nn::Sequential layers;
  layers->push_back(make_embedding(config));
  for (int64_t i = 0; i < config.n_layer; ++i) layers->push_back(make_block(config));
  layers->push_back(LayerNorm(config.n_embd));
  layers->push_back(tied_head(layers));
  return layers;
}

std::vector<LayerSpec> gpt2_layers(const Gpt2Config& config) {
  check_gpt2_config(config);
  const int64_t width = config.n_embd, vocab = config.vocab_size;
  std::vector<LayerSpec> layers;
  layers.push_back(
      layer([config] { return make_embedding(config); }, (vocab + config.block_size) * width));
  // c_attn, attn.c_proj, c_fc, mlp.c_proj and two LayerNorms.
  const int64_t block = 12 * width * width + 13 * width;
  for (int64_t i = 0; i < config.n_layer; ++i) {
    layers.push_back(layer([config] { return make_block(config); }, block));
  }
  layers.push_back(layer([width] { return LayerNorm(width); }, 2 * width));
  // The head: wte's tensor where this process holds it, else a matrix of its own tied by name.
  layers.push_back(layer([width, vocab] { return LMHead(width, vocab); }, vocab * width)
                       .tie("weight", "0.wte.weight", tied_head));
  return layers;
}

}  // namespace pipetrain::nn
