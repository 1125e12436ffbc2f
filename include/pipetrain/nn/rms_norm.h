// RMSNorm (Zhang and Sennrich 2019), as Llama and Qwen3 use it: y = weight * x / sqrt(mean(x^2)
// + eps) over the last dimension, computed in fp32 and returned in the input's dtype (Hugging
// Face's LlamaRMSNorm: the normalised rows are rounded to the input's dtype before the weight
// multiplies them). On a Torch that has at::rms_norm (2.4 and later) it is that operator;
// elsewhere (Debian's 1.13) it is written out. Where pipetrain's CUDA kernels are built, fp32 rows
// on a GPU whose width is a multiple of 4 (the residual stream under autocast) go through
// pipetrain's kernels instead, those of pipetrain::layer_norm (pipetrain/layer_norm.h) without a
// mean or a bias: the values are ATen's within fp32 rounding (the sums' order differs), and the
// forms below take a block's residual adds and casts into the same passes.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

#include <pipetrain/layer_norm.h>

namespace pipetrain::nn {

// `output` as for pipetrain::layer_norm: LayerNormOutput::kAutocastDtype for an RMSNorm whose
// readers are all matmuls, which returns autocast's dtype under autocast (written so by the
// kernels, where ATen's output would be cast).
at::Tensor rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps = 1e-6,
                    LayerNormOutput output = LayerNormOutput::kFloat);

// {input, rms_norm(input)}, for an RMSNorm whose input also goes on along the residual stream (x
// beside input_layernorm(x) in a pre-norm block), as pipetrain::residual_layer_norm: use
// `residual` in place of `input` from there on, and on pipetrain's kernels its gradient is added
// to the RMSNorm's input gradient in the same pass. Elsewhere `residual` is `input` itself.
ResidualLayerNorm residual_rms_norm(const at::Tensor& input, const at::Tensor& weight,
                                    double eps = 1e-6,
                                    LayerNormOutput output = LayerNormOutput::kFloat);

// A residual add and the RMSNorm of its sum (h = x + self_attn(...); then
// post_attention_layernorm(h)): {input + branch, rms_norm(input + branch)}, as
// pipetrain::add_layer_norm: on pipetrain's kernels (input fp32) one pass each way, the sum
// written as it is normalised, the backward writing the gradient of both terms, the branch's in
// its own dtype. Elsewhere, exactly `input + branch` and rms_norm of it.
ResidualLayerNorm add_rms_norm(const at::Tensor& input, const at::Tensor& branch,
                               const at::Tensor& weight, double eps = 1e-6,
                               LayerNormOutput output = LayerNormOutput::kFloat);

struct RMSNormOptions {
  /* implicit */ RMSNormOptions(int64_t dim) : dim_(dim) {}
  TORCH_ARG(int64_t, dim);
  TORCH_ARG(double, eps) = 1e-6;
};

// A weight of `dim` ones (parameter "weight").
class RMSNormImpl : public torch::nn::Module {
 public:
  explicit RMSNormImpl(const RMSNormOptions& options);

  at::Tensor forward(const at::Tensor& input);

  RMSNormOptions options;
  at::Tensor weight;
};
TORCH_MODULE(RMSNorm);

}  // namespace pipetrain::nn
