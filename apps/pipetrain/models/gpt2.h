// GPT-2 (Radford et al. 2019, as nanoGPT and Hugging Face's GPT2LMHeadModel build it) as a
// Sequential a pipeline can cut between any two of its n_layer + 3 layers:
//   0          TokenPositionEmbedding: token (wte) + learned position (wpe) embedding, dropout
//   1..n_layer Gpt2Block: x + attn(ln_1(x)), then x + mlp(ln_2(x)); causal self-attention through
//              one c_attn projection to q, k, v; MLP of 4 n_embd with tanh-approximated GELU
//   n_layer+1  ln_f, the final LayerNorm
//   n_layer+2  the LM head: logits = x wte^T, the token embedding's own tensor (tied weights, so
//              a stage holding the head keeps a copy that gets the sum of both gradients)
// Biases everywhere but the head. Initialisation as GPT-2's: N(0, 0.02) for matrices and
// embeddings, the two residual projections (attn.c_proj, mlp.c_proj) N(0, 0.02 / sqrt(2 n_layer)),
// zero biases, LayerNorms 1 and 0.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include <pipetrain/callback.h>
#include <pipetrain/language_model.h>

namespace pipetrain::cli {

struct Gpt2Config {
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  int64_t block_size = 1024;
  // GPT-2's 50257 tokens padded to a multiple of 64 (as nanoGPT does, for faster GEMMs).
  int64_t vocab_size = 50304;
  double dropout = 0.0;
};

// GPT-2 small, medium, large, xl: "124M", "350M", "774M", "1558M" (n_layer, n_head, n_embd of the
// released models; block 1024, vocabulary 50304). Throws std::invalid_argument naming the sizes.
Gpt2Config gpt2_preset(const std::string& size);

// Model FLOPs of one token's forward and backward, as nanoGPT and the PaLM paper count them:
// 6 N + 12 n_layer n_embd block_size, N the parameters without the position embedding (the tied
// head counted once).
double gpt2_flops_per_token(const Gpt2Config& config);

// The Sequential above, its weights drawn from the default generator. Throws
// std::invalid_argument for a shape that does not fit (n_embd not a multiple of n_head, ...).
torch::nn::Sequential make_gpt2(const Gpt2Config& config);

// The layers above trained as a LanguageModel, built per rank (each process builds, and reads from
// `init_from`, a Hugging Face GPT-2 folder, only its stages' layers), each layer drawn as make_gpt2
// draws it, from its own seed.
class Gpt2Model : public LanguageModel {
 public:
  explicit Gpt2Model(const Gpt2Config& config, double lr = 6e-4);
  Gpt2Model(const Gpt2Config& config, LanguageModelOptions options,
            const std::string& init_from = "");
};

// Logs val_ppl, the validation perplexity exp(val_loss), beside val_loss after every validation of
// a fit: the exponential of the epoch's mean loss (a mean of per-batch exponentials would not be
// a perplexity), so it cannot be a value the steps log.
class PerplexityLogger : public Callback {
 public:
  void on_validation_end(Trainer& trainer, Module& module) override;
};

}  // namespace pipetrain::cli
