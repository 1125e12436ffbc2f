// A small character-level GPT (the shape of nanoGPT) as a built-in model: a real transformer that a
// pipeline can split between its blocks, trained on text that every Debian system already has, so
// a newcomer watches a language model learn without downloading anything.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include <pipetrain/data.h>
#include <pipetrain/language_model.h>

namespace pipetrain::cli {

// The defaults are tuned for 2 CPU cores: as a 2-stage pipeline at batch 32 (windows of stride
// 16, lr 3e-3) they run ~10 steps/s, and val_loss on the licenses falls from 4.6 to 2.4 in 100
// steps and to 1.8 in 300. A block_size of 64 learned no faster per step at two thirds of the
// speed.
struct GptConfig {
  int64_t vocab_size = 0;   // from the corpus: CharVocabulary::size()
  int64_t block_size = 32;  // longest context, in characters
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  double dropout = 0.0;
};

// Characters of a corpus <-> token ids. Ids follow the sorted unique characters (bytes) of the
// text, so the mapping depends only on the text and every rank derives the same one.
class CharVocabulary {
 public:
  explicit CharVocabulary(const std::string& text);

  // One int64 id per character; throws naming the first character that is not in the vocabulary.
  at::Tensor encode(const std::string& text) const;
  // The characters of any tensor of ids (flattened).
  std::string decode(const at::Tensor& ids) const;
  int64_t size() const { return static_cast<int64_t>(chars_.size()); }
  // The vocabulary's characters in id order.
  const std::string& chars() const { return chars_; }

 private:
  std::string chars_;
  std::array<int64_t, 256> ids_;  // by byte value; -1 when absent
};

struct TextCorpus {
  CharVocabulary vocab;     // of the whole text
  at::Tensor train_tokens;  // first 90%, int64 [N]
  at::Tensor val_tokens;    // last 10%
};

// The text a Debian system always has: every license in /usr/share/common-licenses (GPL-3,
// Apache-2.0, ...; symlinked aliases skipped) concatenated in sorted order. A non-empty `path`
// names a text file of the user's instead. Throws with a hint when neither can be read.
TextCorpus load_corpus(const std::string& path = "");

// Windows of `block_size` tokens starting every `stride` tokens: inputs [N, block_size] int64 and
// targets, the same windows shifted one token ahead (the next character at every position).
TensorDataset make_char_windows(const at::Tensor& tokens, int64_t block_size, int64_t stride);

// The GPT as a Sequential of n_layer + 3 modules, each with a single-tensor forward, so the
// pipeline can cut between any two of them:
//   0          embedding: token + learned position, [B, T] int64 -> [B, T, n_embd]
//   1..n_layer pre-norm blocks: x + attn(ln(x)), then x + mlp(ln(x)); causal self-attention,
//              MLP of 4 * n_embd with GELU
//   n_layer+1  final LayerNorm
//   n_layer+2  linear head -> logits [B, T, vocab_size]
// Draws its initial weights (LibTorch's defaults) from the default generator.
torch::nn::Sequential make_gpt(const GptConfig& config);

// Next-character prediction: LanguageModel's steps over torch's cross-entropy of every position
// (not the chunked one, whose rounding differs) and an AdamW of its own (nanoGPT's for few tokens a
// step), so that its runs keep their numbers.
class GptModel : public LanguageModel {
 public:
  explicit GptModel(const GptConfig& config, double lr = 3e-3);

  OptimizerConfig configure_optimizers() override;

 protected:
  at::Tensor loss(const Batch& batch) override;
};

// Continues `prompt` by `max_new_tokens` characters sampled from the whole Sequential on this
// process (in eval mode; its training mode is restored). Each character is drawn from
// softmax(logits / temperature), restricted to the `top_k` likeliest when top_k > 0; temperature 0
// picks the likeliest. The same seed gives the same text. Returns prompt + the new characters.
// It needs every layer's trained weights: under `pipe` a rank trains only its own stage's layers.
std::string generate(torch::nn::Sequential gpt, const CharVocabulary& vocab,
                     const std::string& prompt, int64_t max_new_tokens, double temperature,
                     uint64_t seed, int64_t top_k = 0);

}  // namespace pipetrain::cli
