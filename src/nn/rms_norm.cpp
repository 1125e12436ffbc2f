#include "pipetrain/nn/rms_norm.h"

#include <torch/torch.h>

namespace pipetrain::nn {

// rms_norm and its residual forms live in layer_norm.cpp, beside the LayerNorm's, whose autograd
// functions and kernels they share.

RMSNormImpl::RMSNormImpl(const RMSNormOptions& options_)
    : options(options_), weight(register_parameter("weight", torch::ones({options_.dim()}))) {}

at::Tensor RMSNormImpl::forward(const at::Tensor& input) {
  return rms_norm(input, weight, options.eps());
}

}  // namespace pipetrain::nn
