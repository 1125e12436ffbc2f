// GPT-2 (Radford et al. 2019, as nanoGPT and Hugging Face's GPT2LMHeadModel build it) as a
// Sequential a pipeline cuts between any two of its n_layer + 3 layers:
//   0          Gpt2Embedding: token (wte) + learned position (wpe) embedding, dropout
//                                                                   ("wte.weight", "wpe.weight")
//   1..n_layer Gpt2Block: h = x + attn(ln_1(x)), then h + mlp(ln_2(h)); causal self-attention
//              through one c_attn projection to q, k, v; MLP of 4 n_embd, tanh-approximated GELU
//   n_layer+1  ln_f, the final LayerNorm                            ("weight", "bias")
//   n_layer+2  LMHead: logits = x wte^T, tied to wte                ("weight")
// Parameter names are Hugging Face's below "transformer." ("3.attn.c_attn.weight", "3.ln_2.bias";
// its Conv1D matrices stored transposed), biases everywhere but the head.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/container/any_value.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>
#include <vector>

#include <pipetrain/layer_spec.h>
#include <pipetrain/nn/attention.h>
#include <pipetrain/nn/embedding.h>
#include <pipetrain/nn/kv_cache.h>
#include <pipetrain/nn/mlp.h>

namespace pipetrain::nn {

// The shape of a GPT-2, with Hugging Face's config.json names in the comments.
struct Gpt2Config {
  int64_t n_layer = 12;       // n_layer
  int64_t n_head = 12;        // n_head
  int64_t n_embd = 768;       // n_embd
  int64_t block_size = 1024;  // n_positions: the longest sequence, the position embedding's rows
  // vocab_size: GPT-2's 50257 tokens padded to a multiple of 64 (as nanoGPT does, for faster
  // GEMMs); the padding ids are never targets.
  int64_t vocab_size = 50304;
  double dropout = 0.0;  // after the embedding, on attention weights and after each projection
};

// Throws std::invalid_argument naming the field (and the command's flag) that does not fit.
void check_gpt2_config(const Gpt2Config& config);

// GPT-2 small, medium, large, xl: "124M", "350M", "774M", "1558M" (n_layer, n_head, n_embd of the
// released models; block 1024, vocabulary 50304). Throws std::invalid_argument naming the sizes.
Gpt2Config gpt2_preset(const std::string& size);

// Model FLOPs of one token's forward and backward, as nanoGPT and the PaLM paper count them:
// 6 N + 12 n_layer n_embd block_size, N the parameters without the position embedding (the tied
// head counted once).
double gpt2_flops_per_token(const Gpt2Config& config);

struct Gpt2EmbeddingOptions {
  Gpt2EmbeddingOptions(int64_t vocab_size, int64_t block_size, int64_t n_embd)
      : vocab_size_(vocab_size), block_size_(block_size), n_embd_(n_embd) {}
  TORCH_ARG(int64_t, vocab_size);
  TORCH_ARG(int64_t, block_size);  // the position embedding's rows
  TORCH_ARG(int64_t, n_embd);
  TORCH_ARG(double, dropout) = 0.0;
};

// Token ids [B, T] -> dropout(wte(ids) + wpe(positions)), [B, T, n_embd]. `positions` [B, T]
// (int64, each below block_size) where given: a generated row's own (left padding does not
// count), else 0..T-1 for every row, T at most block_size. A sequence longer than block_size, or
// ids not an integer tensor, is an std::invalid_argument. wte and wpe are nn::Embeddings, so a
// tied LMHead is built from wte.
class Gpt2EmbeddingImpl : public torch::nn::Module {
 public:
  explicit Gpt2EmbeddingImpl(const Gpt2EmbeddingOptions& options);
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& positions = {});

  Gpt2EmbeddingOptions options;
  Embedding wte{nullptr}, wpe{nullptr};

 private:
  torch::nn::Dropout drop_{nullptr};

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(at::Tensor())})
};
TORCH_MODULE(Gpt2Embedding);

// torch::nn::LayerNorm (its parameters "weight" and "bias", names and initialisation) whose
// forward is pipetrain::layer_norm, on a GPU pipetrain's kernels. Every LayerNorm of GPT-2 feeds
// a matmul (c_attn, c_fc, the LM head), so under autocast it returns autocast's dtype.
class LayerNormImpl : public torch::nn::LayerNormImpl {
 public:
  explicit LayerNormImpl(int64_t width);
  at::Tensor forward(const at::Tensor& x);
};
TORCH_MODULE(LayerNorm);

// x + attn(ln_1(x)), then that plus mlp(ln_2(...)): pre-norm, one tensor in and out.
class Gpt2BlockImpl : public torch::nn::Module {
 public:
  explicit Gpt2BlockImpl(const Gpt2Config& config);
  at::Tensor forward(const at::Tensor& x);
  // The block over new tokens after those its attention's `cache` holds (pipetrain/nn/kv_cache.h).
  at::Tensor forward_cached(const at::Tensor& x, KVCache::Layer& cache, const CachedStep& step);

  LayerNorm ln_1{nullptr};
  CausalSelfAttention attn{nullptr};
  LayerNorm ln_2{nullptr};
  GeluMlp mlp{nullptr};

 private:
  // The block around `attend`, which takes ln_1's output to attn's.
  template <typename Attend>
  at::Tensor forward_with(const at::Tensor& x, const Attend& attend);
};
TORCH_MODULE(Gpt2Block);

// The Sequential above, its weights drawn from the default generator as GPT-2's: N(0, 0.02) for
// matrices and embeddings, the two projections into the residual stream (attn.c_proj, mlp.c_proj)
// N(0, 0.02 / sqrt(2 n_layer)), zero biases, LayerNorms 1 and 0. The head is wte's tensor itself.
torch::nn::Sequential gpt2(const Gpt2Config& config);

// The same layers described one by one, for a model built per rank (pipetrain/layer_spec.h): each
// process builds only its stages' layers, each drawn as above from its own seed. The head is a
// matrix of its own tied by name to "0.wte.weight", whose values it starts from; where the process
// holds the embedding too, wte's tensor itself.
std::vector<LayerSpec> gpt2_layers(const Gpt2Config& config);

}  // namespace pipetrain::nn
