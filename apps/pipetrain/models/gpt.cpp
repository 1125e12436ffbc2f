// The character-level GPT: its vocabulary and corpus, the Sequential a pipeline splits, the
// Module the Trainer drives, and sampling. Attention is written out
// (nn::AttentionKernel::kExplicit), the same on Debian's 1.13 and on 2.x.
#include "models/gpt.h"

#include <pipetrain/nn/attention.h>
#include "models/token_embedding.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace pipetrain::cli {
namespace {

constexpr const char* kDefaultCorpusDir = "/usr/share/common-licenses";

// A character as a message can show it: 'a', or its code when it would not print.
std::string describe_char(unsigned char c) {
  char code[8];
  std::snprintf(code, sizeof(code), "0x%02x", c);
  if (c >= 0x20 && c < 0x7f) return "'" + std::string(1, static_cast<char>(c)) + "' (" + code + ")";
  return std::string("byte ") + code;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::invalid_argument("cannot read corpus file '" + path.string() +
                                "' (--corpus): give a text file");
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The licenses in sorted order. Entries that are symlinks ("GPL" -> "GPL-3") are aliases of files
// already there; reading them would repeat those texts.
std::string read_default_corpus() {
  namespace fs = std::filesystem;
  std::error_code error;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(kDefaultCorpusDir, error)) {
    if (entry.is_symlink() || !entry.is_regular_file()) continue;
    files.push_back(entry.path());
  }
  if (files.empty()) {
    throw std::runtime_error(std::string("no text to train on: ") + kDefaultCorpusDir +
                             " is missing or empty (not a Debian system?); give the path of a " +
                             "text file of your own");
  }
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& file : files) text += read_file(file);
  return text;
}

// Written out (AttentionKernel::kExplicit): the same numbers on every Torch.
nn::CausalSelfAttentionOptions attention_options(const GptConfig& config) {
  return nn::CausalSelfAttentionOptions(config.n_embd, config.n_head)
      .bias(true)
      .fused_qkv(true)
      .dropout(config.dropout)
      .kernel(nn::AttentionKernel::kExplicit);
}

// Pre-norm transformer block; residual connections keep it one tensor in, one tensor out, so that
// a stage boundary between blocks carries a single [B, T, C] activation.
class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GptConfig& config)
      : ln1_(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions(
                                        std::vector<int64_t>{config.n_embd})))),
        attn_(register_module("attn", nn::CausalSelfAttention(attention_options(config)))),
        ln2_(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions(
                                        std::vector<int64_t>{config.n_embd})))),
        mlp_(register_module(
            "mlp", torch::nn::Sequential(torch::nn::Linear(config.n_embd, 4 * config.n_embd),
                                         torch::nn::GELU(),
                                         torch::nn::Linear(4 * config.n_embd, config.n_embd),
                                         torch::nn::Dropout(config.dropout)))) {}

  at::Tensor forward(const at::Tensor& x) {
    const auto h = x + attn_(ln1_(x));
    return h + mlp_->forward(ln2_(h));
  }

 private:
  torch::nn::LayerNorm ln1_;
  nn::CausalSelfAttention attn_;
  torch::nn::LayerNorm ln2_;
  torch::nn::Sequential mlp_;
};
TORCH_MODULE(Block);

void validate(const GptConfig& config) {
  auto require = [](bool ok, const std::string& message) {
    if (!ok) throw std::invalid_argument("GptConfig: " + message);
  };
  require(config.vocab_size > 0, "vocab_size must be positive (got " +
                                     std::to_string(config.vocab_size) +
                                     "): use the corpus vocabulary's size()");
  require(config.block_size > 0, "block_size must be positive");
  require(config.n_layer > 0, "n_layer must be positive");
  require(config.n_head > 0 && config.n_embd > 0 && config.n_embd % config.n_head == 0,
          "n_embd (" + std::to_string(config.n_embd) + ") must be a positive multiple of n_head (" +
              std::to_string(config.n_head) + ")");
  require(config.dropout >= 0 && config.dropout < 1, "dropout must be in [0, 1)");
}

// The model's block_size, read from its embedding (the first layer).
int64_t block_size_of(const torch::nn::Sequential& gpt) {
  if (gpt->size() > 0) {
    if (auto* embedding = gpt->ptr(0)->as<TokenPositionEmbeddingImpl>()) {
      return embedding->block_size();
    }
  }
  throw std::invalid_argument("generate() needs a Sequential built by make_gpt()");
}

}  // namespace

CharVocabulary::CharVocabulary(const std::string& text) {
  ids_.fill(-1);
  std::array<bool, 256> seen{};
  for (const char c : text) seen[static_cast<unsigned char>(c)] = true;
  for (int byte = 0; byte < 256; ++byte) {
    if (!seen[byte]) continue;
    ids_[byte] = static_cast<int64_t>(chars_.size());
    chars_.push_back(static_cast<char>(byte));
  }
}

at::Tensor CharVocabulary::encode(const std::string& text) const {
  auto ids = torch::empty({static_cast<int64_t>(text.size())}, torch::kInt64);
  auto* out = ids.data_ptr<int64_t>();
  for (size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (ids_[byte] < 0) {
      throw std::invalid_argument("character " + describe_char(byte) + " at position " +
                                  std::to_string(i) + " is not in the vocabulary of " +
                                  std::to_string(size()) + " characters of the training text");
    }
    out[i] = ids_[byte];
  }
  return ids;
}

std::string CharVocabulary::decode(const at::Tensor& ids) const {
  const auto flat = ids.to(torch::kCPU, torch::kInt64).contiguous().view(-1);
  const auto* in = flat.data_ptr<int64_t>();
  std::string text;
  text.reserve(static_cast<size_t>(flat.numel()));
  for (int64_t i = 0; i < flat.numel(); ++i) {
    if (in[i] < 0 || in[i] >= size()) {
      throw std::out_of_range("token id " + std::to_string(in[i]) + " is outside the vocabulary (" +
                              std::to_string(size()) + " characters)");
    }
    text.push_back(chars_[static_cast<size_t>(in[i])]);
  }
  return text;
}

TextCorpus load_corpus(const std::string& path) {
  const std::string text = path.empty() ? read_default_corpus() : read_file(path);
  const auto source = path.empty() ? std::string(kDefaultCorpusDir) : path;
  // Ten characters leave one in the validation split and a window or two to train on; anything
  // shorter is a mistake, not a corpus.
  if (text.size() < 10) {
    throw std::invalid_argument("corpus '" + source + "' has " + std::to_string(text.size()) +
                                " characters; a corpus needs at least 10");
  }
  CharVocabulary vocab(text);
  const auto tokens = vocab.encode(text);
  const int64_t train_size = tokens.size(0) * 9 / 10;
  return {std::move(vocab), tokens.slice(0, 0, train_size).clone(),
          tokens.slice(0, train_size).clone()};
}

TensorDataset make_char_windows(const at::Tensor& tokens, int64_t block_size, int64_t stride) {
  if (tokens.dim() != 1) {
    throw std::invalid_argument("make_char_windows takes a 1-D tensor of token ids, got " +
                                std::to_string(tokens.dim()) + " dimensions");
  }
  if (block_size < 1 || stride < 1) {
    throw std::invalid_argument("block_size (" + std::to_string(block_size) + ") and stride (" +
                                std::to_string(stride) + ") must be positive");
  }
  // Each window needs block_size inputs plus the one character that follows the last of them.
  if (tokens.size(0) < block_size + 1) {
    throw std::invalid_argument("a text of " + std::to_string(tokens.size(0)) +
                                " tokens is too short for windows of block_size " +
                                std::to_string(block_size) + " (needs block_size + 1 tokens)");
  }
  const auto windows = tokens.to(torch::kInt64).unfold(0, block_size + 1, stride);
  return {windows.slice(1, 0, block_size).contiguous(), windows.slice(1, 1).contiguous()};
}

torch::nn::Sequential make_gpt(const GptConfig& config) {
  validate(config);
  // LibTorch's default initialization, not GPT-2's normal(0, 0.02): at this width (128, not 768)
  // the small weights kept the model near its unigram plateau for most of the demo's steps
  // (val_loss 2.66 after 300 steps, against 1.84 with the defaults).
  torch::nn::Sequential gpt;
  gpt->push_back(TokenPositionEmbedding(
      TokenPositionEmbeddingOptions{"the GPT", config.vocab_size, config.block_size, config.n_embd,
                                    config.dropout, "token", "position", "dropout"}));
  for (int64_t i = 0; i < config.n_layer; ++i) gpt->push_back(Block(config));
  gpt->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd})));
  // No weight tying between head and token embedding: under `pipe` they live on different stages.
  gpt->push_back(
      torch::nn::Linear(torch::nn::LinearOptions(config.n_embd, config.vocab_size).bias(false)));
  return gpt;
}

GptModel::GptModel(const GptConfig& config, double lr)
    : LanguageModel(make_gpt(config), LanguageModelOptions().lr(lr)) {}

at::Tensor GptModel::loss(const Batch& batch) {
  const auto logits = forward(batch.data);  // [B, T, V]
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              batch.target.reshape({-1}));
}

OptimizerConfig GptModel::configure_optimizers() {
  // As nanoGPT: weight decay on the matrices (linear weights, embeddings) only, since decaying
  // biases and LayerNorm gains only fights the normalization; beta2 0.99 because a step sees few
  // tokens, which makes the squared-gradient average noisy.
  std::vector<at::Tensor> matrices, others;
  for (const auto& p : parameters()) (p.dim() >= 2 ? matrices : others).push_back(p);
  const auto adamw = torch::optim::AdamWOptions(options.lr()).betas(std::make_tuple(0.9, 0.99));
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!matrices.empty()) {
    groups.emplace_back(matrices, std::make_unique<torch::optim::AdamWOptions>(
                                      torch::optim::AdamWOptions(adamw).weight_decay(0.1)));
  }
  if (!others.empty()) {
    groups.emplace_back(others, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(adamw).weight_decay(0.0)));
  }
  return std::make_unique<torch::optim::AdamW>(std::move(groups), adamw);
}

std::string generate(torch::nn::Sequential gpt, const CharVocabulary& vocab,
                     const std::string& prompt, int64_t max_new_tokens, double temperature,
                     uint64_t seed, int64_t top_k) {
  if (prompt.empty()) {
    throw std::invalid_argument("generate() needs a prompt of at least one character");
  }
  if (max_new_tokens < 0 || temperature < 0 || top_k < 0) {
    throw std::invalid_argument("generate(): max_new_tokens (" + std::to_string(max_new_tokens) +
                                "), temperature (" + std::to_string(temperature) + ") and top_k (" +
                                std::to_string(top_k) + ") must not be negative");
  }
  const int64_t block_size = block_size_of(gpt);
  const auto parameters = gpt->parameters();
  const auto device = parameters.empty() ? torch::Device(torch::kCPU) : parameters[0].device();
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);

  // Dropout off while sampling; the caller's mode comes back however this returns.
  struct EvalMode {
    torch::nn::Sequential gpt;
    bool was_training;
    ~EvalMode() { gpt->train(was_training); }
  } eval_mode{gpt, gpt->is_training()};
  gpt->eval();
  torch::NoGradGuard no_grad;
  auto ids = vocab.encode(prompt);
  std::vector<int64_t> context(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
  std::string text = prompt;
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    // The model sees at most block_size characters: the latest ones.
    const auto begin = context.size() > static_cast<size_t>(block_size) ? context.end() - block_size
                                                                        : context.begin();
    const auto input = torch::tensor(std::vector<int64_t>(begin, context.end()), torch::kInt64)
                           .unsqueeze(0)
                           .to(device);
    auto logits = gpt->forward(input).select(1, -1).squeeze(0).to(torch::kCPU, torch::kFloat32);
    int64_t next;
    if (temperature == 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      logits = logits / temperature;
      if (top_k > 0 && top_k < logits.size(0)) {
        const auto kth = std::get<0>(logits.topk(top_k)).min();
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<double>::infinity());
      }
      next = torch::multinomial(torch::softmax(logits, -1), 1, false, generator).item<int64_t>();
    }
    context.push_back(next);
    text.push_back(vocab.chars()[static_cast<size_t>(next)]);
  }
  return text;
}

}  // namespace pipetrain::cli
