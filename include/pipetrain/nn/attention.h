// Causal self-attention: the attention of q, k and v, and the layer around it (projections to q,
// k and v, optional rotary embeddings and per-head q/k RMSNorm, the output projection), with
// grouped-query attention (fewer key/value heads than query heads; one is multi-query).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/container/any_value.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <optional>

#include <pipetrain/nn/kv_cache.h>
#include <pipetrain/nn/rms_norm.h>
#include <pipetrain/nn/rotary_embedding.h>

namespace pipetrain::nn {

// Causal attention of q [B, H, T, D] over k, v [B, Hkv, T, D] (H a multiple of Hkv; each group of
// H / Hkv query heads reads one key/value head). kSdpa goes through
// at::scaled_dot_product_attention (flash and memory-efficient kernels; on Torch 2.5 and later GQA
// without materialising repeated keys and values) where the Torch has it (2.x), else it is
// kExplicit: softmax(q k^T / sqrt(D) masked above the diagonal) v, written out, the same numbers on
// every Torch. `documents` [B, T] (pipetrain/nn/documents.h), where defined, keeps each token to
// the keys of its own document as well (a block-diagonal causal mask: SDPA's memory-efficient
// kernel rather than flash, which takes no mask).
enum class AttentionKernel { kSdpa, kExplicit };

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double dropout = 0.0, AttentionKernel kernel = AttentionKernel::kSdpa,
                            const at::Tensor& documents = {});

// The attention of q [B, H, Tq, D] over k, v [B, Hkv, Tk, D] where `allowed` [B, 1, Tq, Tk] is
// true (each query must be allowed one key at least).
at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& allowed, double dropout = 0.0,
                            AttentionKernel kernel = AttentionKernel::kSdpa);

struct CausalSelfAttentionOptions {
  CausalSelfAttentionOptions(int64_t n_embd, int64_t n_head) : n_embd_(n_embd), n_head_(n_head) {}
  TORCH_ARG(int64_t, n_embd);
  TORCH_ARG(int64_t, n_head);
  // Key/value heads; 0: n_head (multi-head attention). A divisor of n_head.
  TORCH_ARG(int64_t, n_kv_head) = 0;
  // Features per head; 0: n_embd / n_head.
  TORCH_ARG(int64_t, head_dim) = 0;
  // Biases on the projections.
  TORCH_ARG(bool, bias) = false;
  // One projection to q, k and v side by side ("c_attn", then "c_proj", GPT-2's names and layout)
  // instead of "q_proj", "k_proj", "v_proj", then "o_proj" (Llama's and Qwen's).
  TORCH_ARG(bool, fused_qkv) = false;
  // Qwen3: an RMSNorm over each head's q and k ("q_norm", "k_norm") before the rotation.
  TORCH_ARG(bool, qk_norm) = false;
  TORCH_ARG(double, norm_eps) = 1e-6;
  // Rotary embeddings of q and k; none: positions come from elsewhere (GPT-2's learned ones).
  TORCH_ARG(std::optional<RotaryEmbeddingOptions>, rotary) = std::nullopt;
  // On the attention weights and after the output projection, while training.
  TORCH_ARG(double, dropout) = 0.0;
  TORCH_ARG(AttentionKernel, kernel) = AttentionKernel::kSdpa;
};

// Throws std::invalid_argument naming the option that does not fit.
void check_attention_options(const CausalSelfAttentionOptions& options);

// x [B, T, n_embd] -> [B, T, n_embd]. The projections go through pipetrain::linear (the bias in
// the GEMM's epilogue; gradient accumulation fused where a pipe stage asks for it). `documents`
// [B, T], where defined: packed documents (pipetrain/nn/documents.h), each token attending within
// its own and rotated by its position in it.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const CausalSelfAttentionOptions& options);

  at::Tensor forward(const at::Tensor& x, const at::Tensor& documents = {});
  // x [B, T, n_embd], new tokens after those `cache` holds (pipetrain/nn/kv_cache.h): their keys
  // and values written into it at step.start, their queries attending as `step` allows.
  at::Tensor forward_cached(const at::Tensor& x, KVCache::Layer& cache, const CachedStep& step);

  CausalSelfAttentionOptions options;
  // Set as options say; the others are empty holders.
  torch::nn::Linear c_attn{nullptr}, q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr};
  torch::nn::Linear output{nullptr};  // "c_proj" or "o_proj"
  RMSNorm q_norm{nullptr}, k_norm{nullptr};
  RotaryEmbedding rotary{nullptr};

 private:
  // q [B, H, T, D], k and v [B, Hkv, T, D] of x, q and k rotated by `positions` [B, T], all
  // below `positions_below` (undefined: 0..T-1).
  std::tuple<at::Tensor, at::Tensor, at::Tensor> project(const at::Tensor& x,
                                                         const at::Tensor& positions,
                                                         int64_t positions_below);
  // Attention's result y [B, H, T, D] through the output projection.
  at::Tensor merge(const at::Tensor& y);

  torch::nn::Dropout resid_dropout_{nullptr};

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(at::Tensor())})
};
TORCH_MODULE(CausalSelfAttention);

}  // namespace pipetrain::nn
