#include "pipetrain/nn/mlp.h"

#include <torch/torch.h>

#include <array>
#include <initializer_list>
#include <optional>

#include <pipetrain/linear.h>

#include "ops/fused_linear.h"

#ifdef PIPETRAIN_HAS_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>

#include "gelu_gemm.h"
#include "swiglu_kernels.h"
#include "util/compat.h"
#include "util/kernel_call.h"
#endif

namespace pipetrain::nn {
namespace {

at::Tensor linear(const torch::nn::Linear& layer, const at::Tensor& x) {
  return pipetrain::linear(x, layer->weight, layer->bias);
}

torch::nn::Linear projection(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// An MLP's projections (SwiGLUOptions or GeluMlpOptions): into its hidden width, and back.
template <typename Options>
torch::nn::Linear into_hidden(const Options& options) {
  return projection(options.n_embd(), options.hidden(), options.bias());
}

template <typename Options>
torch::nn::Linear out_of_hidden(const Options& options) {
  return projection(options.hidden(), options.n_embd(), options.bias());
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

// GPT-2's tanh GELU inside the MLP's GEMMs (gelu_gemm.h), for 16-bit operands that cuBLASLt
// takes: contiguous rows of a width it can stride (a multiple of 8). Anything else, and anything
// cuBLASLt finds no algorithm for, goes through ATen's GEMM and GELU.
ActivationInGemms gelu_in_gemms() {
  using kernels::gemm_context, kernels::gemm_workspace;
  // The kernels' dtype where every tensor is a 16-bit one of x's and the widths are multiples of 8.
  const auto dtype = [](const at::Tensor& x, std::initializer_list<at::Tensor> others,
                        std::initializer_list<int64_t> widths) -> std::optional<kernels::Dtype> {
    const auto type = kernels::kernel_dtype(x);
    if (!type || *type == kernels::Dtype::kFloat) return std::nullopt;
    for (const auto& t : others) {
      if (t.defined() && (t.scalar_type() != x.scalar_type() || t.device() != x.device()))
        return std::nullopt;
    }
    for (const int64_t width : widths) {
      if (width % 8 != 0) return std::nullopt;
    }
    return type;
  };
  ActivationInGemms gelu;
  gelu.forward = [=](const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
    const int64_t rows = x.size(0), in = x.size(1), out = weight.size(0);
    // Shapes that do not fit go to ATen, which names them.
    const bool fits = weight.size(1) == in && (!bias.defined() || bias.numel() == out);
    const c10::cuda::CUDAGuard on_device(x.device());
    if (const auto type = fits ? dtype(x, {weight, bias}, {in, out}) : std::nullopt) {
      const at::Tensor a = x.contiguous(), w = weight.contiguous(), space = gemm_workspace(x);
      const at::Tensor b = bias.defined() ? bias.contiguous() : bias;
      at::Tensor output = at::empty({rows, out}, x.options()), pre = at::empty_like(output);
      if (kernels::linear_gelu(*type, gemm_context(space), a.data_ptr(), w.data_ptr(),
                               b.defined() ? b.data_ptr() : nullptr, rows, in, out,
                               output.data_ptr(), pre.data_ptr())) {
        return std::array<at::Tensor, 2>{output, pre};
      }
    }
    const at::Tensor pre = at::linear(x, weight, optional_tensor(bias));
    return std::array<at::Tensor, 2>{at::gelu(pre, "tanh"), pre};
  };
  gelu.backward = [=](const at::Tensor& grad, const at::Tensor& weight, const at::Tensor& pre) {
    const int64_t rows = grad.size(0), out = weight.size(0), hidden = weight.size(1);
    const bool fits = grad.size(1) == out && pre.size(0) == rows && pre.size(1) == hidden;
    const c10::cuda::CUDAGuard on_device(grad.device());
    if (const auto type = fits ? dtype(grad, {weight, pre}, {out, hidden}) : std::nullopt) {
      const at::Tensor g = grad.contiguous(), w = weight.contiguous(), p = pre.contiguous();
      const at::Tensor space = gemm_workspace(grad);
      at::Tensor grad_pre = at::empty({rows, hidden}, grad.options());
      if (kernels::gelu_input_gradient(*type, gemm_context(space), g.data_ptr(), w.data_ptr(),
                                       p.data_ptr(), rows, out, hidden, grad_pre.data_ptr())) {
        return grad_pre;
      }
    }
    return at::gelu_backward(grad.mm(weight), pre, "tanh");
  };
  return gelu;
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
      gate_proj(register_module("gate_proj", into_hidden(options_))),
      up_proj(register_module("up_proj", into_hidden(options_))),
      down_proj(register_module("down_proj", out_of_hidden(options_))) {}

at::Tensor SwiGLUImpl::forward(const at::Tensor& x) {
  const auto gate_up =
      pipetrain::linears(x, {gate_proj->weight, up_proj->weight}, {gate_proj->bias, up_proj->bias});
  return down_of_swiglu(down_proj, gate_up[0], gate_up[1]);
}

GeluMlpImpl::GeluMlpImpl(const GeluMlpOptions& options_)
    : options(options_),
      c_fc(register_module("c_fc", into_hidden(options_))),
      c_proj(register_module("c_proj", out_of_hidden(options_))),
      dropout_(register_module("drop", torch::nn::Dropout(options_.dropout()))) {}

at::Tensor GeluMlpImpl::forward(const at::Tensor& x) {
#ifdef PIPETRAIN_HAS_CUDA_KERNELS
  if (x.is_cuda()) {
    static const ActivationInGemms gelu = gelu_in_gemms();
    return dropout_(
        linear_activation_linear(gelu, x, c_fc->weight, c_fc->bias, c_proj->weight, c_proj->bias));
  }
#endif
  return dropout_(linear(c_proj, torch::gelu(linear(c_fc, x), "tanh")));
}

}  // namespace pipetrain::nn
