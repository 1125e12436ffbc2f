#include "pipetrain/nn/mlp.h"

#include <torch/torch.h>

#include <pipetrain/linear.h>

#ifdef PIPETRAIN_HAS_CUDA_KERNELS
#include "kernel_call.h"
#include "swiglu_kernels.h"
#endif

namespace pipetrain::nn {
namespace {

at::Tensor linear(const torch::nn::Linear& layer, const at::Tensor& x) {
  return pipetrain::linear(x, layer->weight, layer->bias);
}

torch::nn::Linear projection(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

#ifdef PIPETRAIN_HAS_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// silu(gate) * up for contiguous gate and up of one dtype, saving only them for the backward.
struct SwiGLUFunction : torch::autograd::Function<SwiGLUFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    at::Tensor output = at::empty_like(gate);
    kernels::swiglu_forward(*kernels::kernel_dtype(gate), gate.data_ptr(), up.data_ptr(),
                            gate.numel(), output.data_ptr(), kernels::current_stream());
    ctx->save_for_backward({gate, up});
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &gate = saved[0], &up = saved[1];
    // Autograd hands it over in the output's dtype, at any strides.
    const at::Tensor grad = grads[0].contiguous();
    const at::Tensor grad_gate = ctx->needs_input_grad(0) ? at::empty_like(gate) : at::Tensor();
    const at::Tensor grad_up = ctx->needs_input_grad(1) ? at::empty_like(up) : at::Tensor();
    kernels::swiglu_backward(
        *kernels::kernel_dtype(grad), grad.data_ptr(), gate.data_ptr(), up.data_ptr(), gate.numel(),
        grad_gate.defined() ? grad_gate.data_ptr() : nullptr,
        grad_up.defined() ? grad_up.data_ptr() : nullptr, kernels::current_stream());
    return {grad_gate, grad_up};
  }
};
#endif

// silu(gate) * up: on a GPU one kernel each way (swiglu_kernels.cu) where ATen runs two forward
// and three backward, else ATen's expression.
at::Tensor silu_times(const at::Tensor& gate, const at::Tensor& up) {
#ifdef PIPETRAIN_HAS_CUDA_KERNELS
  if (kernels::kernel_dtype(gate).has_value() && up.scalar_type() == gate.scalar_type() &&
      up.device() == gate.device() && up.sizes() == gate.sizes()) {
    return SwiGLUFunction::apply(gate.contiguous(), up.contiguous());
  }
#endif
  return torch::silu(gate) * up;
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
  const auto gate_up =
      pipetrain::linears(x, {gate_proj->weight, up_proj->weight}, {gate_proj->bias, up_proj->bias});
  return linear(down_proj, silu_times(gate_up[0], gate_up[1]));
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
