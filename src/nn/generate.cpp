#include "pipetrain/nn/generate.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>

#include <pipetrain/nn/decoder.h>
#include <pipetrain/nn/embedding.h>
#include <pipetrain/nn/gpt2.h>
#include <pipetrain/nn/kv_cache.h>

namespace pipetrain::nn {
namespace {

// A model's layers as generation calls them: the embedding of new ids at their positions, each
// block over the cache, the final norm and the head.
struct CachedLayers {
  std::function<at::Tensor(const at::Tensor& ids, const at::Tensor& positions)> embed;
  std::vector<std::function<at::Tensor(const at::Tensor&, KVCache::Layer&, const CachedStep&)>>
      blocks;
  std::function<at::Tensor(const at::Tensor&)> norm;
  LMHeadImpl* head = nullptr;
  int64_t vocab_size = 0;
  // The positions the model has (GPT-2's learned ones); 0: rotary, any.
  int64_t positions = 0;
  at::Device device = at::kCPU;
};

constexpr const char* kModels =
    "generation takes nn::decoder()'s layers (an nn::Embedding, DecoderBlocks, an RMSNorm, an "
    "LMHead) or nn::gpt2()'s (an nn::Gpt2Embedding, Gpt2Blocks, an nn::LayerNorm, an LMHead)";

// Layer `index` of `model` as a `Kind` (a subclass counts: the Document kinds of documents.h).
template <typename Kind>
Kind* layer_as(const torch::nn::Sequential& model, size_t index, const std::string& expected) {
  auto* found = model->ptr(index)->as<Kind>();
  if (found == nullptr) {
    throw std::invalid_argument("generate: layer " + std::to_string(index) +
                                " of the model is not " + expected + ": " + kModels);
  }
  return found;
}

// The layers after the embedding: `Block`s, a `Norm`, an LMHead.
template <typename Block, typename Norm>
void rest_of(const torch::nn::Sequential& model, const std::string& block, const std::string& norm,
             CachedLayers& layers) {
  const size_t size = model->size();
  for (size_t i = 1; i + 2 < size; ++i) {
    auto* found = layer_as<Block>(model, i, block);
    layers.blocks.push_back(
        [found](const at::Tensor& x, KVCache::Layer& cache, const CachedStep& step) {
          return found->forward_cached(x, cache, step);
        });
  }
  auto* found_norm = layer_as<Norm>(model, size - 2, norm);
  layers.norm = [found_norm](const at::Tensor& x) { return found_norm->forward(x); };
  layers.head = layer_as<LMHeadImpl>(model, size - 1, "an LMHead");
}

// The family is the first layer's: a decoder's rotates positions in its attention, GPT-2's adds
// learned ones in its embedding.
CachedLayers layers_of(const torch::nn::Sequential& model) {
  const size_t size = model->size();
  if (size < 4) {
    throw std::invalid_argument(
        "generate: a model has 4 layers at least (an embedding, a block, a norm, an LM head), "
        "this one " +
        std::to_string(size));
  }
  CachedLayers layers;
  if (auto* embedding = model->ptr(0)->as<EmbeddingImpl>()) {
    layers.embed = [embedding](const at::Tensor& ids, const at::Tensor&) {
      return embedding->forward(ids);
    };
    layers.vocab_size = embedding->options.vocab_size();
    layers.device = embedding->weight.device();
    rest_of<DecoderBlockImpl, RMSNormImpl>(model, "a DecoderBlock", "an RMSNorm", layers);
  } else if (auto* gpt2 = model->ptr(0)->as<Gpt2EmbeddingImpl>()) {
    layers.embed = [gpt2](const at::Tensor& ids, const at::Tensor& positions) {
      return gpt2->forward(ids, positions);
    };
    layers.vocab_size = gpt2->options.vocab_size();
    layers.positions = gpt2->options.block_size();
    layers.device = gpt2->wte->weight.device();
    rest_of<Gpt2BlockImpl, LayerNormImpl>(model, "a Gpt2Block", "an nn::LayerNorm", layers);
  } else {
    throw std::invalid_argument("generate: layer 0 of the model is not an embedding: " +
                                std::string(kModels));
  }
  return layers;
}

void check_options(const GenerationOptions& options) {
  const auto require = [](bool ok, const std::string& message) {
    if (!ok) throw std::invalid_argument("generate: " + message);
  };
  require(options.max_new_tokens() > 0,
          "max_new_tokens must be positive, got " + std::to_string(options.max_new_tokens()));
  require(options.temperature() >= 0, "temperature must be 0 (greedy) or positive, got " +
                                          std::to_string(options.temperature()));
  require(options.top_k() >= 0,
          "top_k must be 0 (all) or positive, got " + std::to_string(options.top_k()));
  require(options.top_p() > 0 && options.top_p() <= 1,
          "top_p must be in (0, 1], got " + std::to_string(options.top_p()));
}

}  // namespace

at::Tensor next_tokens(const at::Tensor& logits, const GenerationOptions& options,
                       at::Generator& generator) {
  if (options.temperature() == 0) return logits.argmax(-1);
  auto scores = logits.to(torch::kFloat) / options.temperature();
  const double minus_infinity = -std::numeric_limits<double>::infinity();
  if (options.top_k() > 0 && options.top_k() < scores.size(-1)) {
    const auto kth =
        std::get<0>(scores.topk(options.top_k(), -1)).narrow(-1, options.top_k() - 1, 1);
    scores = scores.masked_fill(scores < kth, minus_infinity);
  }
  if (options.top_p() < 1) {
    const auto [sorted, order] = scores.sort(-1, /*descending=*/true);
    const auto probabilities = sorted.softmax(-1);
    // A token goes where those more likely than it already reach top_p (the first always stays).
    const auto before = probabilities.cumsum(-1) - probabilities;
    const auto dropped = (before >= options.top_p()).scatter(-1, order, before >= options.top_p());
    scores = scores.masked_fill(dropped, minus_infinity);
  }
  const auto probabilities = scores.softmax(-1).to(torch::kCPU);
  return torch::multinomial(probabilities, 1, /*replacement=*/false, generator)
      .squeeze(-1)
      .to(logits.device());
}

std::vector<std::vector<int64_t>> generate(const torch::nn::Sequential& model,
                                           const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerationOptions& options,
                                           const TokenCallback& on_token) {
  check_options(options);
  const CachedLayers layers = layers_of(model);
  const int64_t vocab_size = layers.vocab_size;
  if (options.pad_token_id() < 0 || options.pad_token_id() >= vocab_size) {
    throw std::invalid_argument("generate: pad_token_id " + std::to_string(options.pad_token_id()) +
                                " is outside the model's vocabulary of " +
                                std::to_string(vocab_size));
  }
  if (options.vocab_limit() < 0 || options.vocab_limit() > vocab_size) {
    throw std::invalid_argument("generate: vocab_limit " + std::to_string(options.vocab_limit()) +
                                " must be 0 (every id) or at most the model's vocabulary of " +
                                std::to_string(vocab_size));
  }
  if (prompts.empty()) return {};
  int64_t longest = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) {
      throw std::invalid_argument("generate: prompt " + std::to_string(i) + " has no tokens");
    }
    for (const int64_t id : prompts[i]) {
      if (id < 0 || id >= vocab_size) {
        throw std::invalid_argument("generate: prompt " + std::to_string(i) + " holds the id " +
                                    std::to_string(id) + ", outside the model's vocabulary of " +
                                    std::to_string(vocab_size));
      }
    }
    longest = std::max<int64_t>(longest, static_cast<int64_t>(prompts[i].size()));
  }
  // The last token made is never fed back: the longest row's last position is longest +
  // max_new_tokens - 2.
  if (layers.positions > 0 && longest + options.max_new_tokens() - 1 > layers.positions) {
    throw std::invalid_argument(
        "generate: a prompt of " + std::to_string(longest) + " tokens and " +
        std::to_string(options.max_new_tokens()) + " new ones need " +
        std::to_string(longest + options.max_new_tokens() - 1) + " positions; the model has " +
        std::to_string(layers.positions) + " (its block size): ask for fewer new tokens");
  }
  torch::NoGradGuard no_grad;
  // Eval mode (no dropout) while generating; every module's own mode put back however it ends.
  struct EvalMode {
    explicit EvalMode(torch::nn::Sequential model) {
      for (const auto& module : model->modules(/*include_self=*/true)) {
        modes.emplace_back(module, module->is_training());
      }
      model->eval();
    }
    ~EvalMode() {
      for (auto& [module, training] : modes) module->train(training);
    }
    std::vector<std::pair<std::shared_ptr<torch::nn::Module>, bool>> modes;
  } eval_mode(model);
  const auto device = layers.device;
  const auto ids = torch::TensorOptions().dtype(torch::kInt64);
  const int64_t rows = static_cast<int64_t>(prompts.size());
  const int64_t capacity = longest + options.max_new_tokens();

  // Left padding: row b's prompt fills its last columns; its positions count from its first.
  auto tokens = torch::full({rows, longest}, options.pad_token_id(), ids);
  auto padding = torch::empty({rows}, ids);
  for (int64_t b = 0; b < rows; ++b) {
    const auto& prompt = prompts[static_cast<size_t>(b)];
    const auto pad = longest - static_cast<int64_t>(prompt.size());
    tokens[b].narrow(0, pad, static_cast<int64_t>(prompt.size())).copy_(torch::tensor(prompt, ids));
    padding[b] = pad;
  }
  tokens = tokens.to(device);
  padding = padding.to(device);
  auto attendable =
      torch::arange(capacity, ids.device(device)).unsqueeze(0) >= padding.unsqueeze(1);

  KVCache cache;
  cache.layers.resize(layers.blocks.size());
  // The logits [B, V] of the last of `next` [B, T], the tokens after `start` cached ones.
  const auto forward = [&](int64_t start, const at::Tensor& next) {
    const int64_t time = next.size(1);
    CachedStep step;
    step.capacity = capacity;
    step.start = start;
    const auto columns = torch::arange(start, start + time, ids.device(device));
    step.positions = (columns.unsqueeze(0) - padding.unsqueeze(1)).clamp_min(0);
    const auto keys = torch::arange(start + time, ids.device(device));
    const auto causal = keys.unsqueeze(0) <= columns.unsqueeze(1);  // [T, start + T]
    // A padding query attends to itself alone: a query with no key would give NaN, which the
    // next layer's attention would carry into every row through its masked keys' zero weights.
    const auto itself = keys.unsqueeze(0) == columns.unsqueeze(1);
    step.allowed = attendable.narrow(1, 0, start + time)
                       .unsqueeze(1)
                       .unsqueeze(1)
                       .logical_and(causal)
                       .logical_or(itself);
    auto h = layers.embed(next, step.positions);
    for (size_t l = 0; l < layers.blocks.size(); ++l) {
      h = layers.blocks[l](h, cache.layers[l], step);
    }
    const auto logits = layers.head->forward(layers.norm(h.narrow(1, time - 1, 1))).squeeze(1);
    // Ids past the limit (a head's padding rows) are never chosen.
    return options.vocab_limit() > 0 ? logits.narrow(-1, 0, options.vocab_limit()) : logits;
  };

  auto generator = at::make_generator<at::CPUGeneratorImpl>(options.seed());
  std::vector<std::vector<int64_t>> made(prompts.size());
  std::vector<bool> finished(prompts.size(), false);
  size_t running = prompts.size();
  auto logits = forward(0, tokens);
  for (int64_t n = 0; n < options.max_new_tokens() && running > 0; ++n) {
    auto next = next_tokens(logits, options, generator);
    const auto chosen = next.to(torch::kCPU);
    const auto* values = chosen.data_ptr<int64_t>();
    for (size_t b = 0; b < prompts.size(); ++b) {
      if (finished[b]) continue;
      made[b].push_back(values[b]);
      if (on_token) on_token(b, values[b]);
      const auto& eos = options.eos_token_ids();
      if (std::find(eos.begin(), eos.end(), values[b]) != eos.end()) {
        finished[b] = true;
        --running;
      }
    }
    if (running == 0 || n + 1 == options.max_new_tokens()) break;
    logits = forward(longest + n, next.unsqueeze(1));
  }
  return made;
}

}  // namespace pipetrain::nn
