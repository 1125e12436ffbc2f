#include "pipetrain/nn/mlp.h"

#include <torch/torch.h>

#include <pipetrain/linear.h>

namespace pipetrain::nn {
namespace {

at::Tensor linear(const torch::nn::Linear& layer, const at::Tensor& x) {
  return pipetrain::linear(x, layer->weight, layer->bias);
}

torch::nn::Linear projection(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

}  // namespace

SwiGLUImpl::SwiGLUImpl(const SwiGLUOptions& options_)
    : options(options_),
      gate_proj(register_module("gate_proj",
                                projection(options_.n_embd(), options_.hidden(), options_.bias()))),
      up_proj(register_module("up_proj",
                              projection(options_.n_embd(), options_.hidden(), options_.bias()))),
      down_proj(register_module(
          "down_proj", projection(options_.hidden(), options_.n_embd(), options_.bias()))) {}

at::Tensor SwiGLUImpl::forward(const at::Tensor& x) {
  return linear(down_proj, torch::silu(linear(gate_proj, x)) * linear(up_proj, x));
}

GeluMlpImpl::GeluMlpImpl(const GeluMlpOptions& options_)
    : options(options_),
      c_fc(register_module("c_fc",
                           projection(options_.n_embd(), options_.hidden(), options_.bias()))),
      c_proj(register_module("c_proj",
                             projection(options_.hidden(), options_.n_embd(), options_.bias()))),
      dropout_(register_module("drop", torch::nn::Dropout(options_.dropout()))) {}

at::Tensor GeluMlpImpl::forward(const at::Tensor& x) {
  return dropout_(linear(c_proj, torch::gelu(linear(c_fc, x), "tanh")));
}

}  // namespace pipetrain::nn
