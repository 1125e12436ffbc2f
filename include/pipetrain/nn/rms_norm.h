// RMSNorm (Zhang and Sennrich 2019), as Llama and Qwen3 use it: y = weight * x / sqrt(mean(x^2)
// + eps) over the last dimension, computed in fp32 and returned in the input's dtype (Hugging
// Face's LlamaRMSNorm: the normalised rows are rounded to the input's dtype before the weight
// multiplies them). On a Torch that has at::rms_norm (2.4 and later) it is that operator, whose
// CUDA forward and backward are fused kernels; elsewhere (Debian's 1.13) it is written out.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

namespace pipetrain::nn {

at::Tensor rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps = 1e-6);

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
