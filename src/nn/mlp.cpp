#include "pipetrain/nn/mlp.h"

#include <torch/torch.h>

#include <pipetrain/linear.h>

#include "pipeline/fused_linear.h"

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
// silu(gate) * up through swiglu_kernels.cu: one kernel each way where ATen runs two forward and
// three backward, the backward's writing the product again beside the gradients.
RecomputedElementwise swiglu_on_kernels() {
  RecomputedElementwise swiglu;
  swiglu.forward = [](const at::Tensor& gate, const at::Tensor& up) {
    at::Tensor output = at::empty_like(gate);
    kernels::swiglu_forward(*kernels::kernel_dtype(gate), gate.data_ptr(), up.data_ptr(),
                            gate.numel(), output.data_ptr(), kernels::current_stream());
    return output;
  };
  swiglu.backward = [](const at::Tensor& grad_product, const at::Tensor& gate, const at::Tensor& up,
                       bool gate_needs, bool up_needs) {
    // The down projection's input gradient, in the product's dtype, may come at any strides.
    const at::Tensor grad = grad_product.contiguous();
    std::array<at::Tensor, 3> out{gate_needs ? at::empty_like(gate) : at::Tensor(),
                                  up_needs ? at::empty_like(up) : at::Tensor(),
                                  at::empty_like(gate)};
    const auto pointer = [](const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; };
    kernels::swiglu_backward(*kernels::kernel_dtype(grad), grad.data_ptr(), gate.data_ptr(),
                             up.data_ptr(), gate.numel(), pointer(out[0]), pointer(out[1]),
                             out[2].data_ptr(), kernels::current_stream());
    return out;
  };
  return swiglu;
}
#endif

// down_proj(silu(gate) * up). On a GPU the product is not kept for the down projection's weight
// gradient (a third of the MLP's activations): the backward's kernel, reading gate and up anyway,
// writes it again. Elsewhere ATen's expression and pipetrain::linear.
at::Tensor down_of_swiglu(const torch::nn::Linear& down, const at::Tensor& gate,
                          const at::Tensor& up) {
#ifdef PIPETRAIN_HAS_CUDA_KERNELS
  if (kernels::kernel_dtype(gate).has_value() && up.scalar_type() == gate.scalar_type() &&
      up.device() == gate.device() && up.sizes() == gate.sizes()) {
    static const RecomputedElementwise swiglu = swiglu_on_kernels();
    return linear_after_elementwise(swiglu, gate.contiguous(), up.contiguous(), down->weight,
                                    down->bias);
  }
#endif
  return linear(down, torch::silu(gate) * up);
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
  return down_of_swiglu(down_proj, gate_up[0], gate_up[1]);
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
