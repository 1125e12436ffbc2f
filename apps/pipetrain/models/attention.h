// Causal self-attention, shared by the built-in language models: the attention of q, k and v, and
// the layer around it (one projection to q, k and v, the heads, the output projection).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace pipetrain::cli {

// Causal self-attention of q, k, v [B, H, T, hs]: through at::scaled_dot_product_attention (flash
// and memory-efficient kernels) where the Torch has it (2.x), else written out (Debian's 1.13).
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double dropout);
// The written-out path, always available (the fused one is checked against it).
at::Tensor causal_attention_explicit(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     double dropout);

// What a model chooses of its CausalSelfAttention layers: the shape, the names its saved weights
// go by, and how the two computations are done.
struct CausalSelfAttentionOptions {
  int64_t n_embd = 0;
  int64_t n_head = 0;
  double dropout = 0.0;  // on the attention weights and after the output projection
  // The names its parts' weights are saved under: the projection of x to q, k and v side by side
  // (n_embd -> 3 n_embd), the output projection (n_embd -> n_embd), the dropout after it.
  struct Names {
    std::string qkv, proj, resid_dropout;
  } names;
  // The attention of q, k, v: causal_attention, or causal_attention_explicit for the same numbers
  // on every Torch.
  at::Tensor (*attend)(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       double dropout) = causal_attention;
  // A projection applied to x, given the layer's weight and bias: torch::nn::functional::linear
  // (what torch::nn::Linear's forward calls), or pipetrain::linear (the bias in the GEMM's
  // epilogue, gradient accumulation fused where the stage asks for it).
  at::Tensor (*linear)(const at::Tensor& x, const at::Tensor& weight,
                       const at::Tensor& bias) = torch::nn::functional::linear;
};

// Multi-head causal self-attention of x [B, T, C]: q, k and v from one projection, n_head heads of
// C / n_head, their outputs side by side again through the output projection, then dropout.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const CausalSelfAttentionOptions& options);

  at::Tensor forward(const at::Tensor& x);

 private:
  CausalSelfAttentionOptions options_;
  torch::nn::Linear qkv_, proj_;
  torch::nn::Dropout resid_dropout_;
};
TORCH_MODULE(CausalSelfAttention);

}  // namespace pipetrain::cli
