// `pipetrain::layer_norm`: at::layer_norm over the last dimension, for the LayerNorms inside a
// block of one's own. Where pipetrain's CUDA kernels are built, on fp32 rows whose width is a
// multiple of 4 (autocast runs every LayerNorm in fp32), the forward and both backwards are
// pipetrain's kernels: ATen's sums the weight and bias gradients each 32 columns over all the
// rows in one thread block, which for a transformer's [B x T, C] leaves most of a GPU idle (GPT-2
// 124M at B = 16 on an H200: 79 us a LayerNorm, 5% of a step). The values are ATen's; the sums'
// order differs (relative differences of about 1e-6).
#pragma once

#include <ATen/core/Tensor.h>

namespace pipetrain {

// The dtype pipetrain::layer_norm (and pipetrain::nn::rms_norm, pipetrain/nn/rms_norm.h) returns
// under autocast (without it, both give the input's).
enum class LayerNormOutput {
  // fp32, as autocast's own layer_norm.
  kFloat,
  // Autocast's dtype (bf16 under bf16-mixed), for a LayerNorm whose readers are all matmuls, as
  // every LayerNorm in a pre-norm transformer: they would cast the fp32 output to that dtype
  // anyway. The kernel rounds it once as it writes it, and its backward reads the matmul's
  // low-precision gradient as it is, so neither the output nor its gradient is copied.
  kAutocastDtype,
};

at::Tensor layer_norm(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                      double eps = 1e-5, LayerNormOutput output = LayerNormOutput::kFloat);

// What goes on along a transformer's residual stream, and the LayerNorm (or RMSNorm) of it.
struct ResidualLayerNorm {
  at::Tensor residual;
  at::Tensor normalised;
};

// {input, layer_norm(input)}, for a LayerNorm whose input also goes on along the residual stream
// (x beside ln_1(x) in a pre-norm block). Use `residual` in place of `input` from there on: on
// pipetrain's kernels its gradient comes back through this function, whose backward adds it to
// the LayerNorm's input gradient in the same pass (autograd would add the two in one of its own).
// Elsewhere `residual` is `input` itself.
ResidualLayerNorm residual_layer_norm(const at::Tensor& input, const at::Tensor& weight,
                                      const at::Tensor& bias, double eps = 1e-5,
                                      LayerNormOutput output = LayerNormOutput::kFloat);

// A residual add and the LayerNorm of its sum, as in the middle of a pre-norm transformer block
// (h = x + attn(ln_1(x)); then ln_2(h)): {input + branch, layer_norm(input + branch)}. On
// pipetrain's kernels (input fp32, as the residual stream is under autocast) it is one pass each
// way: the sum is written as it is normalised, and the backward adds the sum's other gradient and
// writes the gradient of both terms, the branch's in its own dtype. Elsewhere, exactly
// `input + branch` and layer_norm of it.
ResidualLayerNorm add_layer_norm(const at::Tensor& input, const at::Tensor& branch,
                                 const at::Tensor& weight, const at::Tensor& bias,
                                 double eps = 1e-5,
                                 LayerNormOutput output = LayerNormOutput::kFloat);

}  // namespace pipetrain
