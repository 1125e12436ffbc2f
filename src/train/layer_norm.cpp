#include "pipetrain/layer_norm.h"

#include <torch/torch.h>

#include "pipetrain/compat.h"

#ifdef PIPETRAIN_HAS_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>

#include "layer_norm_kernels.h"
#endif

namespace pipetrain {
namespace {

#ifdef PIPETRAIN_HAS_CUDA_KERNELS
// ATen's forward and input gradient; the weight's and bias's gradients from our kernel.
struct LayerNormFunction : torch::autograd::Function<LayerNormFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& weight, const at::Tensor& bias, double eps) {
    auto [output, mean, rstd] = at::native_layer_norm(input, {input.size(-1)}, weight, bias, eps);
    ctx->save_for_backward({input, weight, bias, mean, rstd});
    return output;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &input = saved[0], &weight = saved[1], &bias = saved[2], &mean = saved[3],
                     &rstd = saved[4];
    const at::Tensor grad = grads[0].contiguous();
    at::Tensor grad_input, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) {
      grad_input = std::get<0>(at::native_layer_norm_backward(
          grad, input, {input.size(-1)}, mean, rstd, weight, bias, {true, false, false}));
    }
    if (ctx->needs_input_grad(1) || ctx->needs_input_grad(2)) {
      const int64_t columns = input.size(-1), rows = input.numel() / columns;
      grad_weight = at::empty_like(weight);
      grad_bias = at::empty_like(bias);
      const at::Tensor scratch =
          at::empty({kernels::layer_norm_scratch_floats(rows, columns)}, weight.options());
      kernels::layer_norm_weight_gradients(
          grad.data_ptr<float>(), input.data_ptr<float>(), mean.contiguous().data_ptr<float>(),
          rstd.contiguous().data_ptr<float>(), rows, columns, scratch.data_ptr<float>(),
          grad_weight.data_ptr<float>(), grad_bias.data_ptr<float>(),
          c10::cuda::getCurrentCUDAStream().stream());
    }
    return {grad_input, ctx->needs_input_grad(1) ? grad_weight : at::Tensor(),
            ctx->needs_input_grad(2) ? grad_bias : at::Tensor(), at::Tensor()};
  }
};
#endif

}  // namespace

at::Tensor layer_norm(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                      double eps) {
#ifdef PIPETRAIN_HAS_CUDA_KERNELS
  // Autocast runs LayerNorm in fp32; so does the kernel.
  const at::Tensor x =
      input.is_cuda() && autocast_enabled(input.device().type()) ? input.to(at::kFloat) : input;
  const auto fp32 = [](const at::Tensor& t) {
    return t.defined() && t.is_cuda() && t.scalar_type() == at::kFloat;
  };
  if (fp32(x) && fp32(weight) && fp32(bias) && x.numel() > 0 && at::GradMode::is_enabled() &&
      (x.requires_grad() || weight.requires_grad() || bias.requires_grad())) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    return LayerNormFunction::apply(x.contiguous(), weight, bias, eps);
  }
#endif
  return at::layer_norm(input, {input.size(-1)}, optional_tensor(weight), optional_tensor(bias),
                        eps);
}

}  // namespace pipetrain
