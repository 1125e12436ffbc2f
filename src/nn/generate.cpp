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
#include <pipetrain/world.h>

namespace pipetrain::nn {
namespace {

// This process's run of a model's layers, as generation calls them: the embedding of new ids at
// their positions (the first stage's), each block over the cache, the final norm and the head
// (the last stage's). On one process, all of them.
struct StageLayers {
  std::function<at::Tensor(const at::Tensor& ids, const at::Tensor& positions)> embed;
  std::vector<std::function<at::Tensor(const at::Tensor&, KVCache::Layer&, const CachedStep&)>>
      blocks;
  std::function<at::Tensor(const at::Tensor&)> norm;
  LMHeadImpl* head = nullptr;
  // What the first stage's embedding says of the model: its vocabulary, the positions it has
  // (GPT-2's learned ones; 0: rotary, any), the activations' width and dtype.
  int64_t vocab_size = 0, positions = 0, width = 0;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  // What this stage's own layers are: their family (an int of Family), their parameters' dtype,
  // the head's rows (0: no head here).
  int64_t family = 0;
  at::ScalarType own_dtype = at::kFloat;
  int64_t head_rows = 0;
};

constexpr const char* kModels =
    "generation takes nn::decoder()'s layers (an nn::Embedding, DecoderBlocks, an RMSNorm, an "
    "LMHead) or nn::gpt2()'s (an nn::Gpt2Embedding, Gpt2Blocks, an nn::LayerNorm, an LMHead)";

// The two families: a decoder rotates positions in its attention, GPT-2 adds learned ones in its
// embedding.
enum class Family { kUnknown, kDecoder, kGpt2 };

// Layer `index` of `model` as a `Kind` (a subclass counts: the Document kinds of documents.h), or
// nullptr.
template <typename Kind>
Kind* kind_of(const torch::nn::Sequential& model, size_t index) {
  return model->ptr(index)->as<Kind>();
}

[[noreturn]] void refuse_layer(size_t index, const std::string& expected,
                               const std::string& where) {
  throw std::invalid_argument("generate: layer " + std::to_string(index) + " of the " + where +
                              " is not " + expected + ": " + kModels);
}

// `family` becomes `found`'s; a layer of the other family is refused.
void join_family(Family& family, Family found, size_t index, const std::string& where) {
  if (family != Family::kUnknown && family != found) {
    refuse_layer(index, found == Family::kGpt2 ? "a decoder's layer" : "a GPT-2 layer", where);
  }
  family = found;
}

// The layers of `model`, a stage that is the model's `first` and/or `last` (both: the whole
// model). `where` names the model in messages ("model", "stage of rank 1").
StageLayers stage_layers(const torch::nn::Sequential& model, bool first, bool last,
                         const std::string& where) {
  const size_t size = model->size();
  const size_t least = (first ? 1 : 0) + (last ? 2 : 0) + (first && last ? 1 : 0);
  if (size < std::max<size_t>(least, 1)) {
    throw std::invalid_argument(
        "generate: " + std::string(first && last ? "a model" : "this stage") + " has " +
        std::to_string(least) + " layers at least (" +
        (first && last ? "an embedding, a block, a norm, an LM head"
         : first       ? "the embedding"
         : last        ? "the final norm and the LM head"
                       : "a block") +
        "), this " + where + " " + std::to_string(size));
  }
  StageLayers layers;
  Family family = Family::kUnknown;
  size_t begin = 0, end = size;
  if (first) {
    if (auto* embedding = kind_of<EmbeddingImpl>(model, 0)) {
      family = Family::kDecoder;
      layers.embed = [embedding](const at::Tensor& ids, const at::Tensor&) {
        return embedding->forward(ids);
      };
      layers.vocab_size = embedding->options.vocab_size();
      layers.width = embedding->options.n_embd();
      layers.dtype = embedding->weight.scalar_type();
    } else if (auto* gpt2 = kind_of<Gpt2EmbeddingImpl>(model, 0)) {
      family = Family::kGpt2;
      layers.embed = [gpt2](const at::Tensor& ids, const at::Tensor& positions) {
        return gpt2->forward(ids, positions);
      };
      layers.vocab_size = gpt2->options.vocab_size();
      layers.positions = gpt2->options.block_size();
      layers.width = gpt2->options.n_embd();
      layers.dtype = gpt2->wte->weight.scalar_type();
    } else {
      refuse_layer(0, "an embedding", where);
    }
    begin = 1;
  }
  if (last) {
    end = size - 2;
    if (auto* norm = kind_of<RMSNormImpl>(model, end)) {
      join_family(family, Family::kDecoder, end, where);
      layers.norm = [norm](const at::Tensor& x) { return norm->forward(x); };
    } else if (auto* norm = kind_of<LayerNormImpl>(model, end)) {
      join_family(family, Family::kGpt2, end, where);
      layers.norm = [norm](const at::Tensor& x) { return norm->forward(x); };
    } else {
      refuse_layer(end, "a final norm (an RMSNorm or an nn::LayerNorm)", where);
    }
    layers.head = kind_of<LMHeadImpl>(model, size - 1);
    if (layers.head == nullptr) refuse_layer(size - 1, "an LMHead", where);
  }
  for (size_t i = begin; i < end; ++i) {
    if (auto* block = kind_of<DecoderBlockImpl>(model, i)) {
      join_family(family, Family::kDecoder, i, where);
      layers.blocks.push_back(
          [block](const at::Tensor& x, KVCache::Layer& cache, const CachedStep& step) {
            return block->forward_cached(x, cache, step);
          });
    } else if (auto* block = kind_of<Gpt2BlockImpl>(model, i)) {
      join_family(family, Family::kGpt2, i, where);
      layers.blocks.push_back(
          [block](const at::Tensor& x, KVCache::Layer& cache, const CachedStep& step) {
            return block->forward_cached(x, cache, step);
          });
    } else {
      refuse_layer(i, family == Family::kGpt2 ? "a Gpt2Block" : "a DecoderBlock", where);
    }
  }
  const auto parameters = model->parameters();
  if (!parameters.empty()) {
    layers.device = parameters.front().device();
    layers.own_dtype = parameters.front().scalar_type();
  }
  layers.family = static_cast<int64_t>(family);
  if (layers.head != nullptr) layers.head_rows = layers.head->weight.size(0);
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

namespace {

// Makes the layers of every process of `world` (nullptr: this one alone) known to be usable
// before any of them starts: one that refuses its own throws its reason, the others that another
// refused, so no process waits for a partner that has stopped. Then the first stage's facts
// (vocabulary, positions, width, dtype) are every stage's.
// Throws on every rank of `world` where any rank has a `reason` (its own reason, or that another
// rank refused), so that no rank goes on to wait for one that has stopped.
void refuse_together(const World& world, const std::string& reason) {
  if (world.any(!reason.empty())) {
    throw std::invalid_argument(!reason.empty() ? reason
                                                : "generate: another rank refused its stage (its "
                                                  "message says why)");
  }
}

StageLayers agreed_layers(const torch::nn::Sequential& model, const World* world) {
  if (world == nullptr || world->size() == 1) return stage_layers(model, true, true, "model");
  const int64_t rank = world->rank(), last = world->size() - 1;
  const std::string where = "generate: the stage of rank " + std::to_string(rank);
  StageLayers layers;
  std::string refused;
  try {
    layers = stage_layers(model, rank == 0, rank == last, "stage of rank " + std::to_string(rank));
  } catch (const std::invalid_argument& e) {
    refused = e.what();
  }
  refuse_together(*world, refused);
  auto facts = torch::tensor({layers.vocab_size, layers.positions, layers.width,
                              static_cast<int64_t>(layers.dtype), layers.family},
                             torch::dtype(torch::kInt64).device(world->device()));
  world->broadcast_into(facts, 0);
  facts = facts.cpu();
  layers.vocab_size = facts[0].item<int64_t>();
  layers.positions = facts[1].item<int64_t>();
  layers.width = facts[2].item<int64_t>();
  layers.dtype = static_cast<at::ScalarType>(facts[3].item<int64_t>());
  // The stages of one model: one family, one dtype (the activations passed on are rank 0's), a
  // head with a row for every id of the embedding.
  if (layers.family != facts[4].item<int64_t>()) {
    refused = where + " is of another model family than rank 0's: " + kModels;
  } else if (layers.own_dtype != layers.dtype) {
    refused = where + " holds " + std::string(c10::toString(layers.own_dtype)) +
              " parameters, rank 0's " + c10::toString(layers.dtype) +
              ": give every stage one dtype";
  } else if (layers.head != nullptr && layers.head_rows != layers.vocab_size) {
    refused = where + " has an LM head of " + std::to_string(layers.head_rows) +
              " rows for an embedding of " + std::to_string(layers.vocab_size) + " ids";
  }
  refuse_together(*world, refused);
  return layers;
}

// Every check of the prompts and options, the same on every process.
int64_t longest_prompt(const StageLayers& layers, const std::vector<std::vector<int64_t>>& prompts,
                       const GenerationOptions& options) {
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
  return longest;
}

// Eval mode (no dropout) while generating; every module's own mode put back however it ends.
class EvalMode {
 public:
  explicit EvalMode(torch::nn::Sequential model) {
    for (const auto& module : model->modules(/*include_self=*/true)) {
      modes_.emplace_back(module, module->is_training());
    }
    model->eval();
  }
  ~EvalMode() {
    for (auto& [module, training] : modes_) module->train(training);
  }

 private:
  std::vector<std::pair<std::shared_ptr<torch::nn::Module>, bool>> modes_;
};

std::vector<std::vector<int64_t>> generate_on(const torch::nn::Sequential& model,
                                              const World* world,
                                              const std::vector<std::vector<int64_t>>& prompts,
                                              const GenerationOptions& options,
                                              const TokenCallback& on_token) {
  check_options(options);
  const StageLayers layers = agreed_layers(model, world);
  const int64_t longest = longest_prompt(layers, prompts, options);
  if (prompts.empty()) return {};
  const int64_t rank = world ? world->rank() : 0;
  const int64_t stages = world ? world->size() : 1;
  torch::NoGradGuard no_grad;
  const EvalMode eval_mode(model);
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
  // This stage's part of the forward of `next` [B, T], the tokens after `start` cached ones: from
  // the ids (the first stage) or the previous stage's activations, to the activations for the
  // next stage, or (the last stage) the logits [B, V] of each row's last token.
  const auto forward = [&](int64_t start, const at::Tensor& next, at::Tensor h) {
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
    if (layers.embed) h = layers.embed(next, step.positions);
    for (size_t l = 0; l < layers.blocks.size(); ++l) {
      h = layers.blocks[l](h, cache.layers[l], step);
    }
    if (layers.head == nullptr) return h;
    const auto logits = layers.head->forward(layers.norm(h.narrow(1, time - 1, 1))).squeeze(1);
    // Ids past the limit (a head's padding rows) are never chosen.
    return options.vocab_limit() > 0 ? logits.narrow(-1, 0, options.vocab_limit()) : logits;
  };

  auto generator = at::make_generator<at::CPUGeneratorImpl>(options.seed());
  // Each row's next token after `next` [B, T], on every stage: the activations pass from stage to
  // stage (each a broadcast every rank takes part in, so that all meet the same collectives in
  // the same order), and the last stage's choice comes back to all.
  const auto next_of = [&](int64_t start, const at::Tensor& next) {
    at::Tensor h;
    if (rank == 0) h = forward(start, next, h);
    for (int64_t from = 0; from + 1 < stages; ++from) {
      auto passed = rank == from ? h.to(world->device()).contiguous()
                                 : torch::empty({rows, next.size(1), layers.width},
                                                torch::dtype(layers.dtype).device(world->device()));
      world->broadcast_into(passed, from);
      if (rank == from + 1) h = forward(start, next, passed.to(device));
    }
    at::Tensor chosen = rank == stages - 1 ? next_tokens(h, options, generator).to(device)
                                           : torch::empty({rows}, ids.device(device));
    if (stages > 1) {
      auto shared = chosen.to(world->device());
      world->broadcast_into(shared, stages - 1);
      chosen = shared.to(device);
    }
    return chosen;
  };

  std::vector<std::vector<int64_t>> made(prompts.size());
  std::vector<bool> finished(prompts.size(), false);
  size_t running = prompts.size();
  auto next = next_of(0, tokens);
  for (int64_t n = 0; n < options.max_new_tokens() && running > 0; ++n) {
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
    next = next_of(longest + n, next.unsqueeze(1));
  }
  return made;
}

}  // namespace

std::vector<std::vector<int64_t>> generate(const torch::nn::Sequential& model,
                                           const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerationOptions& options,
                                           const TokenCallback& on_token) {
  return generate_on(model, nullptr, prompts, options, on_token);
}

std::vector<std::vector<int64_t>> generate(const torch::nn::Sequential& stage, const World& world,
                                           const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerationOptions& options,
                                           const TokenCallback& on_token) {
  try {
    return generate_on(stage, &world, prompts, options, on_token);
  } catch (const std::exception& e) {
    // The other ranks, waiting for this one in a step's broadcast, then report why it stopped.
    world.publish_error(e.what());
    throw;
  }
}

}  // namespace pipetrain::nn
