// pipetrain::layer_norm and pipetrain::nn::rms_norm with their residual forms: ATen's, or on a GPU
// the same autograd functions around the kernels of layer_norm_kernels.cu, which take an RMSNorm
// as a LayerNorm without a mean or a bias.
#include "pipetrain/layer_norm.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <cstdint>

#include <pipetrain/nn/rms_norm.h>

#include "util/compat.h"

#ifdef PIPETRAIN_HAS_CUDA_KERNELS
#include "layer_norm_kernels.h"
#include "util/kernel_call.h"
#endif

namespace pipetrain {
namespace {

// Whether the output is to be in autocast's dtype.
bool in_autocast_dtype(const at::Tensor& input, LayerNormOutput output) {
  return output == LayerNormOutput::kAutocastDtype && autocast_enabled(input.device().type());
}

// Hugging Face's LlamaRMSNorm: in fp32, the normalised rows rounded to the input's dtype before
// the weight multiplies them.
at::Tensor aten_rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps) {
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

#ifdef PIPETRAIN_HAS_CUDA_KERNELS
using kernels::Norm;
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

// `t`'s floats, or null for a tensor the norm does not have (an RMSNorm's bias, mean and their
// gradients, a sum without a residual add).
float* floats_or_null(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

// The norm's forward on `input` (fp32, contiguous) or, with `branch`, on input + branch, written
// to `sum`. Returns the output; fills rstd, and mean for a LayerNorm.
at::Tensor forward_rows(Norm norm, const at::Tensor& input, const at::Tensor& branch,
                        const at::Tensor& weight, const at::Tensor& bias, double eps,
                        at::ScalarType output_type, const at::Tensor& sum, at::Tensor& mean,
                        at::Tensor& rstd) {
  at::Tensor output = at::empty(input.sizes(), input.options().dtype(output_type));
  if (norm == Norm::kLayerNorm) mean = at::empty({rows_of(input)}, input.options());
  rstd = at::empty({rows_of(input)}, input.options());
  kernels::norm_forward(norm, input.data_ptr<float>(),
                        branch.defined() ? *kernels::kernel_dtype(branch) : kernels::Dtype::kFloat,
                        branch.defined() ? branch.data_ptr() : nullptr, weight.data_ptr<float>(),
                        floats_or_null(bias), rows_of(input), columns_of(input), eps,
                        floats_or_null(sum), *kernels::kernel_dtype(output_type), output.data_ptr(),
                        floats_or_null(mean), rstd.data_ptr<float>(), kernels::current_stream());
  return output;
}

// The norm's gradients at `x` for the output's gradient `grad`, each where the context needs it
// (the weight is autograd input `weight_index`, a LayerNorm's bias the next one; an RMSNorm's
// functions are given none; `input_needed`: the input's): {input (fp32), weight, bias}. The
// input's gets `grad_sum` added where defined (x's gradient from its other readers) and is written
// again to `grad_branch` where defined, in its dtype.
variable_list gradients(AutogradContext* ctx, Norm norm, size_t weight_index, bool input_needed,
                        const at::Tensor& grad, const at::Tensor& x, const at::Tensor& mean,
                        const at::Tensor& rstd, const at::Tensor& weight,
                        const at::Tensor& grad_sum, const at::Tensor& grad_branch) {
  const bool weight_needed = ctx->needs_input_grad(weight_index),
             bias_needed = norm == Norm::kLayerNorm && ctx->needs_input_grad(weight_index + 1);
  const at::Tensor grad_input = input_needed ? at::empty_like(x) : at::Tensor();
  at::Tensor grad_weight, grad_bias, scratch;
  if (weight_needed || bias_needed) {
    grad_weight = at::empty_like(weight);
    if (norm == Norm::kLayerNorm) grad_bias = at::empty_like(weight);
    scratch = at::empty({kernels::norm_scratch_floats(norm, rows_of(x), columns_of(x))},
                        weight.options());
  }
  if (!grad_input.defined() && !grad_weight.defined()) return {at::Tensor(), {}, {}};
  kernels::norm_gradients(
      norm, *kernels::kernel_dtype(grad), grad.data_ptr(), x.data_ptr<float>(),
      floats_or_null(mean), rstd.data_ptr<float>(), weight.data_ptr<float>(), rows_of(x),
      columns_of(x), floats_or_null(grad_sum), floats_or_null(grad_input),
      grad_branch.defined() ? *kernels::kernel_dtype(grad_branch) : kernels::Dtype::kFloat,
      grad_branch.defined() ? grad_branch.data_ptr() : nullptr, floats_or_null(scratch),
      floats_or_null(grad_weight), floats_or_null(grad_bias), kernels::current_stream());
  return {grad_input, weight_needed ? grad_weight : at::Tensor(),
          bias_needed ? grad_bias : at::Tensor()};
}

// The functions below take the bias as an optional (a LayerNorm's, none for an RMSNorm), which
// autograd counts as an input only where it is there: an undefined at::Tensor would not do.
using OptionalTensor = c10::optional<at::Tensor>;

template <Norm kNorm>
struct NormFunction : torch::autograd::Function<NormFunction<kNorm>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const OptionalTensor& bias, double eps, at::ScalarType output_type) {
    at::Tensor mean, rstd;
    at::Tensor output =
        forward_rows(kNorm, input, at::Tensor(), weight, bias.value_or(at::Tensor()), eps,
                     output_type, at::Tensor(), mean, rstd);
    ctx->save_for_backward({input, weight, mean, rstd});
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &input = saved[0], &weight = saved[1], &mean = saved[2], &rstd = saved[3];
    // Autograd hands the gradient over in the output's dtype.
    const at::Tensor grad = for_kernels(grads[0]);
    auto result = gradients(ctx, kNorm, 1, ctx->needs_input_grad(0), grad, input, mean, rstd,
                            weight, at::Tensor(), at::Tensor());
    result.resize(5);  // eps and the output's dtype get none
    return result;
  }
};

// {input, norm(input)}: the first output is input itself, as autograd passes an input returned
// unchanged (a view of it), so that its gradient reaches this backward.
template <Norm kNorm>
struct ResidualNormFunction : torch::autograd::Function<ResidualNormFunction<kNorm>> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const at::Tensor& weight, const OptionalTensor& bias, double eps,
                               at::ScalarType output_type) {
    at::Tensor mean, rstd;
    at::Tensor output =
        forward_rows(kNorm, input, at::Tensor(), weight, bias.value_or(at::Tensor()), eps,
                     output_type, at::Tensor(), mean, rstd);
    ctx->save_for_backward({input, weight, mean, rstd});
    return {input, output};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &input = saved[0], &weight = saved[1], &mean = saved[2], &rstd = saved[3];
    // Both arrive defined (autograd gives zeros for an output nobody read).
    const at::Tensor grad_residual = for_kernels(grads[0]), grad = for_kernels(grads[1]);
    auto result = gradients(ctx, kNorm, 1, ctx->needs_input_grad(0), grad, input, mean, rstd,
                            weight, grad_residual, at::Tensor());
    result.resize(5);  // eps and the output's dtype get none
    return result;
  }
};

// {input + branch, norm(input + branch)}, input fp32.
template <Norm kNorm>
struct AddNormFunction : torch::autograd::Function<AddNormFunction<kNorm>> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const at::Tensor& branch, const at::Tensor& weight,
                               const OptionalTensor& bias, double eps, at::ScalarType output_type) {
    at::Tensor mean, rstd;
    const at::Tensor sum = at::empty_like(input);
    at::Tensor output = forward_rows(kNorm, input, branch, weight, bias.value_or(at::Tensor()), eps,
                                     output_type, sum, mean, rstd);
    ctx->save_for_backward({sum, weight, mean, rstd});
    ctx->saved_data["branch_dtype"] = static_cast<int64_t>(branch.scalar_type());
    return {sum, output};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &sum = saved[0], &weight = saved[1], &mean = saved[2], &rstd = saved[3];
    // Both arrive defined (autograd gives zeros for an output nobody read).
    const at::Tensor grad_sum = for_kernels(grads[0]), grad = for_kernels(grads[1]);
    at::Tensor grad_branch;
    if (ctx->needs_input_grad(1)) {
      const auto branch_type = static_cast<at::ScalarType>(ctx->saved_data["branch_dtype"].toInt());
      grad_branch = at::empty(sum.sizes(), sum.options().dtype(branch_type));
    }
    // The sum's gradient is both terms': computed where either needs it.
    const auto result =
        gradients(ctx, kNorm, 2, ctx->needs_input_grad(0) || ctx->needs_input_grad(1), grad, sum,
                  mean, rstd, weight, grad_sum, grad_branch);
    return {ctx->needs_input_grad(0) ? result[0] : at::Tensor(),
            grad_branch,
            result[1],
            result[2],
            at::Tensor(),
            at::Tensor()};
  }
};

bool fp32_on_gpu(const at::Tensor& t) {
  return t.defined() && t.is_cuda() && t.scalar_type() == at::kFloat;
}

// Whether the kernels take norm kNorm of `x` (already fp32 where autocast is on), with `bias` for
// a LayerNorm and none for an RMSNorm.
template <Norm kNorm>
bool kernels_take(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  at::ScalarType output_type) {
  const bool bias_taken = kNorm == Norm::kLayerNorm
                              ? fp32_on_gpu(bias) && bias.sizes() == weight.sizes() && aligned(bias)
                              : !bias.defined();
  return fp32_on_gpu(x) && fp32_on_gpu(weight) && bias_taken && x.numel() > 0 &&
         weight.dim() == 1 && weight.numel() == x.size(-1) &&
         kernels::norm_takes_columns(x.size(-1)) &&
         kernels::kernel_dtype(output_type).has_value() && aligned(x) && aligned(weight);
}

// The output dtype of a norm of fp32 rows: autocast's where it is asked for and on, else fp32.
at::ScalarType rows_output_type(const at::Tensor& input, LayerNormOutput output) {
  return in_autocast_dtype(input, output) ? autocast_dtype(input.device().type()) : at::kFloat;
}

OptionalTensor contiguous_bias(const at::Tensor& bias) {
  return bias.defined() ? OptionalTensor(bias.contiguous()) : OptionalTensor();
}

// {input, norm(input)} on the kernels, or nothing where they do not take it.
template <Norm kNorm>
c10::optional<ResidualLayerNorm> residual_norm_on_kernels(const at::Tensor& input,
                                                          const at::Tensor& weight,
                                                          const at::Tensor& bias, double eps,
                                                          LayerNormOutput output) {
  const at::ScalarType output_type = rows_output_type(input, output);
  if (!kernels_take<kNorm>(input, weight, bias, output_type) || !input.is_contiguous()) return {};
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const auto outputs = ResidualNormFunction<kNorm>::apply(input, weight.contiguous(),
                                                          contiguous_bias(bias), eps, output_type);
  return ResidualLayerNorm{outputs[0], outputs[1]};
}

// {input + branch, norm(input + branch)} on the kernels, or nothing where they do not take it.
template <Norm kNorm>
c10::optional<ResidualLayerNorm> add_norm_on_kernels(const at::Tensor& input,
                                                     const at::Tensor& branch,
                                                     const at::Tensor& weight,
                                                     const at::Tensor& bias, double eps,
                                                     LayerNormOutput output) {
  const at::ScalarType output_type = rows_output_type(input, output);
  if (!kernels_take<kNorm>(input, weight, bias, output_type) || !branch.is_cuda() ||
      branch.device() != input.device() || branch.sizes() != input.sizes() ||
      !kernels::kernel_dtype(branch).has_value() || !aligned(branch)) {
    return {};
  }
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const auto outputs =
      AddNormFunction<kNorm>::apply(input.contiguous(), branch.contiguous(), weight.contiguous(),
                                    contiguous_bias(bias), eps, output_type);
  return ResidualLayerNorm{outputs[0], outputs[1]};
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
  if (kernels_take<Norm::kLayerNorm>(x, weight, bias, output_type)) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    return NormFunction<Norm::kLayerNorm>::apply(x.contiguous(), weight.contiguous(),
                                                 contiguous_bias(bias), eps, output_type);
  }
#endif
  const at::Tensor y =
      at::layer_norm(input, {input.size(-1)}, optional_tensor(weight), optional_tensor(bias), eps);
  return cast ? y.to(autocast_dtype(input.device().type())) : y;
}

ResidualLayerNorm residual_layer_norm(const at::Tensor& input, const at::Tensor& weight,
                                      const at::Tensor& bias, double eps, LayerNormOutput output) {
#ifdef PIPETRAIN_HAS_CUDA_KERNELS
  if (auto fused = residual_norm_on_kernels<Norm::kLayerNorm>(input, weight, bias, eps, output)) {
    return *fused;
  }
#endif
  return {input, layer_norm(input, weight, bias, eps, output)};
}

ResidualLayerNorm add_layer_norm(const at::Tensor& input, const at::Tensor& branch,
                                 const at::Tensor& weight, const at::Tensor& bias, double eps,
                                 LayerNormOutput output) {
#ifdef PIPETRAIN_HAS_CUDA_KERNELS
  if (auto fused =
          add_norm_on_kernels<Norm::kLayerNorm>(input, branch, weight, bias, eps, output)) {
    return *fused;
  }
#endif
  const at::Tensor sum = input + branch;
  return {sum, layer_norm(sum, weight, bias, eps, output)};
}

namespace nn {

// The kernels compute an RMSNorm in fp32 throughout and take fp32 rows only: those of a
// low-precision input, ATen's (as Hugging Face's) are rounded before the weight multiplies them.
at::Tensor rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps,
                    LayerNormOutput output) {
  const bool cast = in_autocast_dtype(input, output);
#ifdef PIPETRAIN_HAS_CUDA_KERNELS
  const at::ScalarType output_type = rows_output_type(input, output);
  if (kernels_take<Norm::kRmsNorm>(input, weight, at::Tensor(), output_type)) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    return NormFunction<Norm::kRmsNorm>::apply(input.contiguous(), weight.contiguous(),
                                               OptionalTensor(), eps, output_type);
  }
#endif
  const at::Tensor y = aten_rms_norm(input, weight, eps);
  return cast ? y.to(autocast_dtype(input.device().type())) : y;
}

ResidualLayerNorm residual_rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps,
                                    LayerNormOutput output) {
#ifdef PIPETRAIN_HAS_CUDA_KERNELS
  if (auto fused =
          residual_norm_on_kernels<Norm::kRmsNorm>(input, weight, at::Tensor(), eps, output)) {
    return *fused;
  }
#endif
  return {input, rms_norm(input, weight, eps, output)};
}

ResidualLayerNorm add_rms_norm(const at::Tensor& input, const at::Tensor& branch,
                               const at::Tensor& weight, double eps, LayerNormOutput output) {
#ifdef PIPETRAIN_HAS_CUDA_KERNELS
  if (auto fused =
          add_norm_on_kernels<Norm::kRmsNorm>(input, branch, weight, at::Tensor(), eps, output)) {
    return *fused;
  }
#endif
  const at::Tensor sum = input + branch;
  return {sum, rms_norm(sum, weight, eps, output)};
}

}  // namespace nn
}  // namespace pipetrain
