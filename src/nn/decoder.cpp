#include "pipetrain/nn/decoder.h"

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <stdexcept>

#include <pipetrain/nn/documents.h>
#include <pipetrain/nn/embedding.h>

namespace pipetrain::nn {

DecoderBlockImpl::DecoderBlockImpl(const DecoderBlockOptions& options_)
    : options(options_),
      input_layernorm(register_module(
          "input_layernorm",
          RMSNorm(RMSNormOptions(options_.attention().n_embd()).eps(options_.norm_eps())))),
      self_attn(register_module("self_attn", CausalSelfAttention(options_.attention()))),
      post_attention_layernorm(register_module(
          "post_attention_layernorm",
          RMSNorm(RMSNormOptions(options_.attention().n_embd()).eps(options_.norm_eps())))),
      mlp(register_module("mlp", SwiGLU(options_.mlp()))) {}

at::Tensor DecoderBlockImpl::forward(const at::Tensor& x) { return forward_in_documents(x, {}); }

at::Tensor DecoderBlockImpl::forward_in_documents(const at::Tensor& x,
                                                  const at::Tensor& documents) {
  return forward_with(
      x, [&](const at::Tensor& normalised) { return self_attn->forward(normalised, documents); });
}

at::Tensor DecoderBlockImpl::forward_cached(const at::Tensor& x, KVCache::Layer& cache,
                                            const CachedStep& step) {
  return forward_with(x, [&](const at::Tensor& normalised) {
    return self_attn->forward_cached(normalised, cache, step);
  });
}

template <typename Attend>
at::Tensor DecoderBlockImpl::forward_with(const at::Tensor& x, const Attend& attend) {
  // input_layernorm(x) beside x, then h = x + self_attn(...) and post_attention_layernorm(h) in
  // one pass; each RMSNorm's backward adds the residual stream's gradient (the two modules hold
  // the weights). Their outputs are read by matmuls alone (q, k and v; gate and up), so under
  // autocast they come in autocast's dtype, cast once where each matmul would cast them again.
  constexpr auto to_matmuls = LayerNormOutput::kAutocastDtype;
  const auto first =
      residual_rms_norm(x, input_layernorm->weight, input_layernorm->options.eps(), to_matmuls);
  const auto second =
      add_rms_norm(first.residual, attend(first.normalised), post_attention_layernorm->weight,
                   post_attention_layernorm->options.eps(), to_matmuls);
  return second.residual + mlp(second.normalised);
}

void check_decoder_config(const DecoderConfig& config) {
  auto require = [](bool ok, const std::string& message) {
    if (!ok) throw std::invalid_argument("decoder: " + message);
  };
  auto positive = [&](int64_t value, const std::string& field, const std::string& flag) {
    require(value > 0, field + " (" + flag + ") must be positive, got " + std::to_string(value));
  };
  positive(config.vocab_size, "vocab_size", "--vocab-size");
  positive(config.n_layer, "n_layer", "--n-layer");
  positive(config.n_embd, "n_embd", "--n-embd");
  positive(config.n_head, "n_head", "--n-head");
  positive(config.intermediate_size, "intermediate_size", "--intermediate-size");
  positive(config.block_size, "block_size", "--block-size");
  require(config.n_kv_head >= 0 && config.n_head % config.kv_heads() == 0,
          "n_head (--n-head " + std::to_string(config.n_head) +
              ") must be a multiple of n_kv_head (--n-kv-head " +
              std::to_string(config.kv_heads()) + ")");
  require(config.head_dim > 0 || config.n_embd % config.n_head == 0,
          "n_embd (--n-embd " + std::to_string(config.n_embd) +
              ") is not a multiple of n_head (--n-head " + std::to_string(config.n_head) +
              "): give head_dim (--head-dim)");
  require(config.rms_norm_eps > 0, "rms_norm_eps (--rms-norm-eps) must be positive");
  require(config.n_kv_head >= 0 && config.head_dim >= 0 && config.max_position_embeddings >= 0,
          "n_kv_head, head_dim and max_position_embeddings are positive, or 0 for their defaults");
  require(!config.document_separator ||
              (*config.document_separator >= 0 && *config.document_separator < config.vocab_size),
          "document_separator " + std::to_string(config.document_separator.value_or(0)) +
              " is not an id of the vocabulary of " + std::to_string(config.vocab_size));
  auto rope = config.rope;
  rope.head_dim(config.head_size());
  check_rotary_options(rope);
}

namespace {

// What a preset of either family sets beyond its vocabulary, context and norms: its size, whether
// the head is tied, and 8 key-value heads (every Llama 3 and Qwen3 preset below has 8).
DecoderConfig preset_shape(int64_t n_layer, int64_t n_embd, int64_t n_head, int64_t intermediate,
                           bool tied) {
  DecoderConfig config;
  config.n_layer = n_layer;
  config.n_embd = n_embd;
  config.n_head = n_head;
  config.n_kv_head = 8;
  config.intermediate_size = intermediate;
  config.tie_word_embeddings = tied;
  return config;
}

DecoderConfig llama3(int64_t n_layer, int64_t n_embd, int64_t n_head, int64_t intermediate,
                     bool tied, double factor) {
  DecoderConfig config = preset_shape(n_layer, n_embd, n_head, intermediate, tied);
  config.vocab_size = 128256;
  config.max_position_embeddings = 131072;
  config.rms_norm_eps = 1e-5;
  config.rope.theta(500000)
      .rope_type("llama3")
      .factor(factor)
      .low_freq_factor(1)
      .high_freq_factor(4)
      .original_max_position_embeddings(8192);
  return config;
}

DecoderConfig qwen3(int64_t n_layer, int64_t n_embd, int64_t n_head, int64_t intermediate,
                    bool tied) {
  DecoderConfig config = preset_shape(n_layer, n_embd, n_head, intermediate, tied);
  config.vocab_size = 151936;
  config.head_dim = 128;
  config.max_position_embeddings = 40960;
  config.rms_norm_eps = 1e-6;
  config.qk_norm = true;
  config.rope.theta(1000000);
  return config;
}

const std::map<std::string, DecoderConfig>& presets() {
  static const std::map<std::string, DecoderConfig> all = [] {
    std::map<std::string, DecoderConfig> by_name;
    by_name["llama3.2-1b"] = llama3(16, 2048, 32, 8192, true, 32);
    by_name["llama3.2-3b"] = llama3(28, 3072, 24, 8192, true, 32);
    by_name["llama3.2-3b"].head_dim = 128;
    by_name["llama3.1-8b"] = llama3(32, 4096, 32, 14336, false, 8);
    by_name["qwen3-0.6b"] = qwen3(28, 1024, 16, 3072, true);
    by_name["qwen3-1.7b"] = qwen3(28, 2048, 16, 6144, true);
    by_name["qwen3-4b"] = qwen3(36, 2560, 32, 9728, true);
    by_name["qwen3-8b"] = qwen3(36, 4096, 32, 12288, false);
    DecoderConfig small;  // the defaults: 12 layers of 768, FFN 2048, vocabulary 32000
    small.n_kv_head = 4;
    small.tie_word_embeddings = true;
    small.max_position_embeddings = 8192;  // Llama 3's
    small.rope.theta(500000);
    by_name["llama-150m"] = small;
    return by_name;
  }();
  return all;
}

}  // namespace

std::vector<std::string> decoder_preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, config] : presets()) names.push_back(name);
  return names;
}

DecoderConfig decoder_preset(const std::string& name) {
  const auto found = presets().find(name);
  if (found == presets().end()) {
    std::string names;
    for (const auto& known : decoder_preset_names()) names += (names.empty() ? "" : ", ") + known;
    throw std::invalid_argument("unknown decoder preset '" + name + "': use " + names);
  }
  return found->second;
}

namespace {

DecoderBlockOptions block_options(const DecoderConfig& config) {
  const auto attention = CausalSelfAttentionOptions(config.n_embd, config.n_head)
                             .n_kv_head(config.kv_heads())
                             .head_dim(config.head_size())
                             .bias(config.attention_bias)
                             .qk_norm(config.qk_norm)
                             .norm_eps(config.rms_norm_eps)
                             .rotary(config.rope)  // its head_dim is the attention's
                             .kernel(config.attention_kernel);
  return DecoderBlockOptions(attention, SwiGLUOptions(config.n_embd, config.intermediate_size))
      .norm_eps(config.rms_norm_eps);
}

// The layers of a decoder over packed documents (documents.h) where the config has a separator,
// else of one over plain rows: the same parameters under the same names. A Sequential calls the
// forward of the type it is given, so each comes as an AnyModule of its own type.
torch::nn::AnyModule make_embedding(const DecoderConfig& config) {
  torch::NoGradGuard no_grad;
  const EmbeddingOptions options(config.vocab_size, config.n_embd);
  if (config.document_separator) {
    DocumentEmbedding embedding(options, *config.document_separator);
    embedding->weight.normal_(0, config.init_std);
    return torch::nn::AnyModule(embedding);
  }
  Embedding embedding(options);
  embedding->weight.normal_(0, config.init_std);
  return torch::nn::AnyModule(embedding);
}

// torchtitan's depth initialisation: what block l adds to the residual stream shrinks with l.
void initialise_block(DecoderBlockImpl& decoder_block, const DecoderConfig& config, int64_t l) {
  torch::NoGradGuard no_grad;
  const double residual_std = config.init_std / std::sqrt(2.0 * static_cast<double>(l + 1));
  for (auto& item : decoder_block.named_parameters()) {
    const std::string& name = item.key();
    auto& tensor = item.value();
    if (name.find("norm") != std::string::npos) continue;  // RMSNorm weights: ones
    if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      tensor.zero_();
    } else if (name.rfind("self_attn.o_proj", 0) == 0 || name.rfind("mlp.up_proj", 0) == 0 ||
               name.rfind("mlp.down_proj", 0) == 0) {
      tensor.normal_(0, residual_std);
    } else {
      tensor.normal_(0, config.init_std);
    }
  }
}

torch::nn::AnyModule make_block(const DecoderConfig& config, const DecoderBlockOptions& options,
                                int64_t l) {
  if (config.document_separator) {
    DocumentDecoderBlock decoder_block(options);
    initialise_block(*decoder_block, config, l);
    return torch::nn::AnyModule(decoder_block);
  }
  DecoderBlock decoder_block(options);
  initialise_block(*decoder_block, config, l);
  return torch::nn::AnyModule(decoder_block);
}

torch::nn::AnyModule make_norm(const DecoderConfig& config) {
  const auto options = RMSNormOptions(config.n_embd).eps(config.rms_norm_eps);
  if (config.document_separator) return torch::nn::AnyModule(DocumentRMSNorm(options));
  return torch::nn::AnyModule(RMSNorm(options));
}

// The embedding in layer 0 of `layers` (a DocumentEmbedding is one too).
Embedding embedding_of(const torch::nn::Sequential& layers) {
  return Embedding(std::dynamic_pointer_cast<EmbeddingImpl>(layers->ptr(0)));
}

LMHead make_untied_head(const DecoderConfig& config) {
  torch::NoGradGuard no_grad;
  LMHead head(config.n_embd, config.vocab_size);
  head->weight.normal_(0, config.init_std);
  return head;
}

}  // namespace

torch::nn::Sequential decoder(const DecoderConfig& config) {
  check_decoder_config(config);
  const auto block = block_options(config);
  torch::nn::Sequential layers;
  layers->push_back(make_embedding(config));
  for (int64_t l = 0; l < config.n_layer; ++l) layers->push_back(make_block(config, block, l));
  layers->push_back(make_norm(config));
  layers->push_back(config.tie_word_embeddings ? LMHead(embedding_of(layers))
                                               : make_untied_head(config));
  return layers;
}

std::vector<LayerSpec> decoder_layers(const DecoderConfig& config) {
  check_decoder_config(config);
  const auto block = block_options(config);
  const int64_t width = config.n_embd, vocab = config.vocab_size;
  std::vector<LayerSpec> layers;
  layers.push_back(layer([config] { return make_embedding(config); }, vocab * width));
  for (int64_t l = 0; l < config.n_layer; ++l) {
    layers.push_back(layer([config, block, l] { return make_block(config, block, l); }));
  }
  layers.push_back(layer([config] { return make_norm(config); }, width));
  if (config.tie_word_embeddings) {
    layers.push_back(
        layer([config] { return LMHead(config.n_embd, config.vocab_size); }, vocab * width)
            .tie("weight", "0.weight",
                 [](const torch::nn::Sequential& built) { return LMHead(embedding_of(built)); }));
  } else {
    layers.push_back(layer([config] { return make_untied_head(config); }, vocab * width));
  }
  return layers;
}

double decoder_flops_per_token(const DecoderConfig& config) {
  const double width = static_cast<double>(config.n_embd);
  const double q_width = static_cast<double>(config.n_head * config.head_size());
  const double kv_width = static_cast<double>(config.kv_heads() * config.head_size());
  const double ffn = static_cast<double>(config.intermediate_size);
  // Per block: q, k, v and o projections, the three MLP matrices (norms and biases are not
  // multiplications worth counting).
  const double block = width * (2 * q_width + 2 * kv_width) + 3 * width * ffn;
  const double head = static_cast<double>(config.vocab_size) * width;
  const double parameters = static_cast<double>(config.n_layer) * block + head;
  return 6 * parameters + 12 * static_cast<double>(config.n_layer) * q_width *
                              static_cast<double>(config.block_size);
}

}  // namespace pipetrain::nn
