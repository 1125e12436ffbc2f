#include "pipetrain/layer_norm.h"

#include <torch/torch.h>

#include <cstdint>

#include "util/compat.h"

#ifdef PIPETRAIN_HAS_CUDA_KERNELS
#include "kernel_call.h"
#include "layer_norm_kernels.h"
#endif

namespace pipetrain {
namespace {

// Whether the output is to be in autocast's dtype.
bool in_autocast_dtype(const at::Tensor& input, LayerNormOutput output) {
  return output == LayerNormOutput::kAutocastDtype && autocast_enabled(input.device().type());
}

#ifdef PIPETRAIN_HAS_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t columns_of(const at::Tensor& rows) { return rows.size(-1); }
int64_t rows_of(const at::Tensor& rows) { return rows.numel() / rows.size(-1); }

// The kernels read 4 elements (up to 16 bytes) at a time.
bool aligned(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// A gradient autograd hands over, as the kernels read it: contiguous and aligned (a view at an
// odd offset is copied).
at::Tensor for_kernels(const at::Tensor& grad) {
  at::Tensor rows = grad.contiguous();
  return aligned(rows) ? rows : rows.clone();
}

// The LayerNorm's forward on `input` (fp32, contiguous) or, with `branch`, on input + branch,
// written to `sum`. Returns the output; fills mean and rstd.
at::Tensor forward_rows(const at::Tensor& input, const at::Tensor& branch, const at::Tensor& weight,
                        const at::Tensor& bias, double eps, at::ScalarType output_type,
                        const at::Tensor& sum, at::Tensor& mean, at::Tensor& rstd) {
  at::Tensor output = at::empty(input.sizes(), input.options().dtype(output_type));
  mean = at::empty({rows_of(input)}, input.options());
  rstd = at::empty({rows_of(input)}, input.options());
  kernels::add_layer_norm_forward(
      input.data_ptr<float>(),
      branch.defined() ? *kernels::kernel_dtype(branch) : kernels::Dtype::kFloat,
      branch.defined() ? branch.data_ptr() : nullptr, weight.data_ptr<float>(),
      bias.data_ptr<float>(), rows_of(input), columns_of(input), eps,
      sum.defined() ? sum.data_ptr<float>() : nullptr, *kernels::kernel_dtype(output),
      output.data_ptr(), mean.data_ptr<float>(), rstd.data_ptr<float>(), kernels::current_stream());
  return output;
}

// The weight's and bias's gradients of the LayerNorm of `x`, or undefined tensors where the
// context needs neither (their input positions: `weight_index`, `weight_index + 1`).
std::pair<at::Tensor, at::Tensor> weight_gradients(AutogradContext* ctx, size_t weight_index,
                                                   const at::Tensor& grad, const at::Tensor& x,
                                                   const at::Tensor& mean, const at::Tensor& rstd,
                                                   const at::Tensor& weight) {
  const bool weight_needed = ctx->needs_input_grad(weight_index),
             bias_needed = ctx->needs_input_grad(weight_index + 1);
  if (!weight_needed && !bias_needed) return {};
  at::Tensor grad_weight = at::empty_like(weight), grad_bias = at::empty_like(weight);
  const at::Tensor scratch =
      at::empty({kernels::layer_norm_scratch_floats(rows_of(x), columns_of(x))}, weight.options());
  kernels::layer_norm_weight_gradients(
      *kernels::kernel_dtype(grad), grad.data_ptr(), x.data_ptr<float>(), mean.data_ptr<float>(),
      rstd.data_ptr<float>(), rows_of(x), columns_of(x), scratch.data_ptr<float>(),
      grad_weight.data_ptr<float>(), grad_bias.data_ptr<float>(), kernels::current_stream());
  return {weight_needed ? grad_weight : at::Tensor(), bias_needed ? grad_bias : at::Tensor()};
}

struct LayerNormFunction : torch::autograd::Function<LayerNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, double eps, at::ScalarType output_type) {
    at::Tensor mean, rstd;
    at::Tensor output =
        forward_rows(input, at::Tensor(), weight, bias, eps, output_type, at::Tensor(), mean, rstd);
    ctx->save_for_backward({input, weight, mean, rstd});
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &input = saved[0], &weight = saved[1], &mean = saved[2], &rstd = saved[3];
    // Autograd hands the gradient over in the output's dtype.
    const at::Tensor grad = for_kernels(grads[0]);
    at::Tensor grad_input;
    if (ctx->needs_input_grad(0)) {
      grad_input = at::empty_like(input);
      kernels::layer_norm_input_gradient(
          *kernels::kernel_dtype(grad), grad.data_ptr(), input.data_ptr<float>(),
          mean.data_ptr<float>(), rstd.data_ptr<float>(), weight.data_ptr<float>(), rows_of(input),
          columns_of(input), nullptr, grad_input.data_ptr<float>(), kernels::Dtype::kFloat, nullptr,
          kernels::current_stream());
    }
    auto [grad_weight, grad_bias] = weight_gradients(ctx, 1, grad, input, mean, rstd, weight);
    return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor()};
  }
};

// {input, layer_norm(input)}: the first output is input itself, as autograd passes an input
// returned unchanged (a view of it), so that its gradient reaches this backward.
struct ResidualLayerNormFunction : torch::autograd::Function<ResidualLayerNormFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const at::Tensor& weight, const at::Tensor& bias, double eps,
                               at::ScalarType output_type) {
    at::Tensor mean, rstd;
    at::Tensor output =
        forward_rows(input, at::Tensor(), weight, bias, eps, output_type, at::Tensor(), mean, rstd);
    ctx->save_for_backward({input, weight, mean, rstd});
    return {input, output};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &input = saved[0], &weight = saved[1], &mean = saved[2], &rstd = saved[3];
    // Both arrive defined (autograd gives zeros for an output nobody read).
    const at::Tensor grad_residual = for_kernels(grads[0]), grad = for_kernels(grads[1]);
    at::Tensor grad_input;
    if (ctx->needs_input_grad(0)) {
      grad_input = at::empty_like(input);
      kernels::layer_norm_input_gradient(
          *kernels::kernel_dtype(grad), grad.data_ptr(), input.data_ptr<float>(),
          mean.data_ptr<float>(), rstd.data_ptr<float>(), weight.data_ptr<float>(), rows_of(input),
          columns_of(input), grad_residual.data_ptr<float>(), grad_input.data_ptr<float>(),
          kernels::Dtype::kFloat, nullptr, kernels::current_stream());
    }
    auto [grad_weight, grad_bias] = weight_gradients(ctx, 1, grad, input, mean, rstd, weight);
    return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor()};
  }
};

// {input + branch, layer_norm(input + branch)}, input fp32.
struct AddLayerNormFunction : torch::autograd::Function<AddLayerNormFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const at::Tensor& branch, const at::Tensor& weight,
                               const at::Tensor& bias, double eps, at::ScalarType output_type) {
    at::Tensor mean, rstd;
    const at::Tensor sum = at::empty_like(input);
    at::Tensor output =
        forward_rows(input, branch, weight, bias, eps, output_type, sum, mean, rstd);
    ctx->save_for_backward({sum, weight, mean, rstd});
    ctx->saved_data["branch_dtype"] = static_cast<int64_t>(branch.scalar_type());
    return {sum, output};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &sum = saved[0], &weight = saved[1], &mean = saved[2], &rstd = saved[3];
    // Both arrive defined (autograd gives zeros for an output nobody read).
    const at::Tensor grad_sum = for_kernels(grads[0]), grad = for_kernels(grads[1]);
    at::Tensor grad_input, grad_branch;
    if (ctx->needs_input_grad(0) || ctx->needs_input_grad(1)) {
      grad_input = at::empty_like(sum);
      const auto branch_type = static_cast<at::ScalarType>(ctx->saved_data["branch_dtype"].toInt());
      if (ctx->needs_input_grad(1)) {
        grad_branch = at::empty(sum.sizes(), sum.options().dtype(branch_type));
      }
      kernels::layer_norm_input_gradient(
          *kernels::kernel_dtype(grad), grad.data_ptr(), sum.data_ptr<float>(),
          mean.data_ptr<float>(), rstd.data_ptr<float>(), weight.data_ptr<float>(), rows_of(sum),
          columns_of(sum), grad_sum.data_ptr<float>(), grad_input.data_ptr<float>(),
          *kernels::kernel_dtype(branch_type),
          grad_branch.defined() ? grad_branch.data_ptr() : nullptr, kernels::current_stream());
    }
    auto [grad_weight, grad_bias] = weight_gradients(ctx, 2, grad, sum, mean, rstd, weight);
    return {ctx->needs_input_grad(0) ? grad_input : at::Tensor(),
            grad_branch,
            grad_weight,
            grad_bias,
            at::Tensor(),
            at::Tensor()};
  }
};

bool fp32_on_gpu(const at::Tensor& t) {
  return t.defined() && t.is_cuda() && t.scalar_type() == at::kFloat;
}

// Whether the kernels take the LayerNorm of `x` (already fp32 where autocast is on).
bool kernels_take(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  at::ScalarType output_type) {
  return fp32_on_gpu(x) && fp32_on_gpu(weight) && fp32_on_gpu(bias) && x.numel() > 0 &&
         weight.dim() == 1 && weight.numel() == x.size(-1) && bias.sizes() == weight.sizes() &&
         kernels::layer_norm_takes_columns(x.size(-1)) &&
         kernels::kernel_dtype(output_type).has_value() && aligned(x) && aligned(weight) &&
         aligned(bias);
}
#endif

}  // namespace

at::Tensor layer_norm(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                      double eps, LayerNormOutput output) {
  const bool cast = in_autocast_dtype(input, output);
#ifdef PIPETRAIN_HAS_CUDA_KERNELS
  // Autocast runs LayerNorm in fp32; so do the kernels.
  const at::Tensor x =
      input.is_cuda() && autocast_enabled(input.device().type()) ? input.to(at::kFloat) : input;
  const at::ScalarType output_type = cast ? autocast_dtype(x.device().type()) : x.scalar_type();
  if (kernels_take(x, weight, bias, output_type)) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    return LayerNormFunction::apply(x.contiguous(), weight.contiguous(), bias.contiguous(), eps,
                                    output_type);
  }
#endif
  const at::Tensor y =
      at::layer_norm(input, {input.size(-1)}, optional_tensor(weight), optional_tensor(bias), eps);
  return cast ? y.to(autocast_dtype(input.device().type())) : y;
}

ResidualLayerNorm residual_layer_norm(const at::Tensor& input, const at::Tensor& weight,
                                      const at::Tensor& bias, double eps, LayerNormOutput output) {
#ifdef PIPETRAIN_HAS_CUDA_KERNELS
  const bool cast = in_autocast_dtype(input, output);
  const at::ScalarType output_type = cast ? autocast_dtype(input.device().type()) : at::kFloat;
  if (kernels_take(input, weight, bias, output_type) && input.is_contiguous()) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto outputs = ResidualLayerNormFunction::apply(input, weight.contiguous(),
                                                          bias.contiguous(), eps, output_type);
    return {outputs[0], outputs[1]};
  }
#endif
  return {input, layer_norm(input, weight, bias, eps, output)};
}

ResidualLayerNorm add_layer_norm(const at::Tensor& input, const at::Tensor& branch,
                                 const at::Tensor& weight, const at::Tensor& bias, double eps,
                                 LayerNormOutput output) {
#ifdef PIPETRAIN_HAS_CUDA_KERNELS
  const bool cast = in_autocast_dtype(input, output);
  const at::ScalarType output_type = cast ? autocast_dtype(input.device().type()) : at::kFloat;
  if (kernels_take(input, weight, bias, output_type) && branch.is_cuda() &&
      branch.device() == input.device() && branch.sizes() == input.sizes() &&
      kernels::kernel_dtype(branch).has_value() && aligned(branch)) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto outputs =
        AddLayerNormFunction::apply(input.contiguous(), branch.contiguous(), weight.contiguous(),
                                    bias.contiguous(), eps, output_type);
    return {outputs[0], outputs[1]};
  }
#endif
  const at::Tensor sum = input + branch;
  return {sum, layer_norm(sum, weight, bias, eps, output)};
}

}  // namespace pipetrain
