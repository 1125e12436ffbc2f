#include "pipetrain/nn/rms_norm.h"

#include <torch/torch.h>
#include <torch/version.h>

namespace pipetrain::nn {

at::Tensor rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  // Runs in fp32 under autocast (its fp32 list) and upcasts a low-precision input itself.
  if (input.scalar_type() == weight.scalar_type()) {
    return at::rms_norm(input, {input.size(-1)}, weight, eps);
  }
#endif
  const auto x = input.to(torch::kFloat32);
  const auto normalised = x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normalised.to(input.scalar_type());
}

RMSNormImpl::RMSNormImpl(const RMSNormOptions& options_)
    : options(options_), weight(register_parameter("weight", torch::ones({options_.dim()}))) {}

at::Tensor RMSNormImpl::forward(const at::Tensor& input) {
  return rms_norm(input, weight, options.eps());
}

}  // namespace pipetrain::nn
