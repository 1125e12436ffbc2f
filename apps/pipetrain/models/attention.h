// Causal self-attention, shared by the built-in language models.
#pragma once

#include <ATen/Tensor.h>

namespace pipetrain::cli {

// Causal self-attention of q, k, v [B, H, T, hs]: through at::scaled_dot_product_attention (flash
// and memory-efficient kernels) where the Torch has it (2.x), else written out (Debian's 1.13).
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double dropout);
// The written-out path, always available (the fused one is checked against it).
at::Tensor causal_attention_explicit(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     double dropout);

}  // namespace pipetrain::cli
