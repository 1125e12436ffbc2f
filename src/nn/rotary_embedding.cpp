#include "pipetrain/nn/rotary_embedding.h"

#include <torch/torch.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "util/compat.h"

#ifdef PIPETRAIN_HAS_CUDA_KERNELS
#include "rotary_kernels.h"
#include "util/kernel_call.h"
#endif

namespace pipetrain::nn {

#ifdef PIPETRAIN_HAS_CUDA_KERNELS
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Whether the kernels take x [B, H, T, D] rotated by cos and sin: x on a GPU, its features
// adjacent (its other dimensions at any stride: attention's transposed views of a projection), the
// tables [T, D] contiguous beside it in x's dtype or fp32 (autocast's) and needing no gradient
// (the kernels give the tables none).
bool kernels_take(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return kernels::kernel_dtype(x).has_value() && x.dim() == 4 && x.numel() > 0 &&
         x.size(3) % 2 == 0 && x.stride(3) == 1 && cos.device() == x.device() &&
         sin.device() == x.device() && sin.scalar_type() == cos.scalar_type() &&
         (cos.scalar_type() == x.scalar_type() || cos.scalar_type() == at::kFloat) &&
         cos.dim() == 2 && cos.size(0) == x.size(2) && cos.size(1) == x.size(3) &&
         sin.sizes() == cos.sizes() && cos.is_contiguous() && sin.is_contiguous() &&
         !cos.requires_grad() && !sin.requires_grad();
}

// The layout the rotated x and x's gradient take: x's own where x is dense, so that attention's
// transposed views of a projection get results laid out as ATen's elementwise ops lay them out
// (and the gradient goes back through the transpose and the view without a copy); else
// contiguous (none).
std::vector<int64_t> dense_layout(const at::Tensor& x) {
  return x.is_non_overlapping_and_dense() ? x.strides().vec() : std::vector<int64_t>();
}

at::Tensor empty_in_layout(at::IntArrayRef sizes, const std::vector<int64_t>& layout,
                           const at::TensorOptions& options) {
  return layout.empty() ? at::empty(sizes, options) : at::empty_strided(sizes, layout, options);
}

// The kernels' view of one tensor read (`input`) and one written (`output`), both [B, H, T, D].
kernels::RotaryHeads rotary_heads(const at::Tensor& input, const at::Tensor& output) {
  kernels::RotaryHeads heads;
  heads.heads = input.size(1);
  heads.input = input.data_ptr();
  heads.output = output.data_ptr();
  for (int64_t d = 0; d < 3; ++d) {
    heads.input_strides[d] = input.stride(d);
    heads.output_strides[d] = output.stride(d);
  }
  return heads;
}

// Whether the kernels rotate x into `rotated`: the tables' dtype, or x's where the tables are fp32.
bool kernels_give(const at::Tensor& x, const at::Tensor& cos, at::ScalarType rotated) {
  return rotated == cos.scalar_type() ||
         (rotated == x.scalar_type() && cos.scalar_type() == at::kFloat);
}

// `xs` (x, or q and k) rotated in one launch, each result in `rotated_type` (the tables' dtype,
// what ATen's promotion gives x * cos, or x's) and laid out as dense_layout says. Saves what
// rotated_gradients needs.
variable_list rotate_on_gpu(AutogradContext* ctx, const variable_list& xs, const at::Tensor& cos,
                            const at::Tensor& sin, at::ScalarType rotated_type) {
  variable_list rotated;
  std::vector<kernels::RotaryHeads> heads(2);
  for (size_t i = 0; i < xs.size(); ++i) {
    const auto layout = dense_layout(xs[i]);
    rotated.push_back(empty_in_layout(xs[i].sizes(), layout, cos.options().dtype(rotated_type)));
    heads[i] = rotary_heads(xs[i], rotated[i]);
    ctx->saved_data["layout" + std::to_string(i)] = layout;
  }
  const at::Tensor& x = xs[0];
  kernels::rotary_forward(
      *kernels::kernel_dtype(x.scalar_type()), *kernels::kernel_dtype(cos.scalar_type()),
      *kernels::kernel_dtype(rotated_type), heads[0], heads[1], x.size(0), x.size(2), x.size(3),
      cos.data_ptr(), sin.data_ptr(), kernels::current_stream());
  ctx->save_for_backward({cos, sin});
  ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
  ctx->saved_data["rotated_dtype"] = static_cast<int64_t>(rotated_type);
  return rotated;
}

// The gradients of rotate_on_gpu's inputs from those of its results, in one launch.
variable_list rotated_gradients(AutogradContext* ctx, const variable_list& grads) {
  const auto saved = ctx->get_saved_variables();
  const at::Tensor &cos = saved[0], &sin = saved[1];
  const auto x_type = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
  const auto rotated_type = static_cast<at::ScalarType>(ctx->saved_data["rotated_dtype"].toInt());
  variable_list inputs, results;
  std::vector<kernels::RotaryHeads> heads(2);
  for (size_t i = 0; i < grads.size(); ++i) {
    // Autograd hands each over in its result's dtype, at any strides.
    const auto grad = grads[i].to(rotated_type);
    inputs.push_back(grad.stride(3) == 1 ? grad : grad.contiguous());
    results.push_back(empty_in_layout(grads[i].sizes(),
                                      ctx->saved_data["layout" + std::to_string(i)].toIntVector(),
                                      grads[i].options().dtype(x_type)));
    heads[i] = rotary_heads(inputs[i], results[i]);
  }
  const at::Tensor& grad = inputs[0];
  kernels::rotary_backward(
      *kernels::kernel_dtype(x_type), *kernels::kernel_dtype(cos.scalar_type()),
      *kernels::kernel_dtype(rotated_type), heads[0], heads[1], grad.size(0), grad.size(2),
      grad.size(3), cos.data_ptr(), sin.data_ptr(), kernels::current_stream());
  return results;
}

struct RotaryFunction : torch::autograd::Function<RotaryFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin) {
    return rotate_on_gpu(ctx, {x}, cos, sin, cos.scalar_type())[0];
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {rotated_gradients(ctx, grads)[0], at::Tensor(), at::Tensor()};
  }
};

// q and k, which share the tables, in one launch each way.
struct RotaryPairFunction : torch::autograd::Function<RotaryPairFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& cos, const at::Tensor& sin,
                               at::ScalarType rotated_type) {
    return rotate_on_gpu(ctx, {q, k}, cos, sin, rotated_type);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto gradients = rotated_gradients(ctx, grads);
    return {gradients[0], gradients[1], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace
#endif

void check_rotary_options(const RotaryEmbeddingOptions& options) {
  auto require = [](bool ok, const std::string& message) {
    if (!ok) throw std::invalid_argument("RotaryEmbedding: " + message);
  };
  require(options.head_dim() > 0 && options.head_dim() % 2 == 0,
          "head_dim " + std::to_string(options.head_dim()) +
              " must be positive and even (the features are rotated in pairs)");
  require(options.theta() > 0, "theta (rope_theta) must be positive");
  require(options.rope_type() == "default" || options.rope_type() == "llama3",
          "rope_type '" + options.rope_type() +
              "' is not implemented: use default or llama3 (yarn, dynamic, linear and longrope "
              "are not)");
  if (options.rope_type() == "llama3") {
    require(options.factor() > 0, "llama3 scaling: factor must be positive");
    require(options.low_freq_factor() > 0 && options.high_freq_factor() > options.low_freq_factor(),
            "llama3 scaling: high_freq_factor must be above low_freq_factor, both positive");
    require(options.original_max_position_embeddings() > 0,
            "llama3 scaling: original_max_position_embeddings must be positive");
  }
}

at::Tensor rotary_inverse_frequencies(const RotaryEmbeddingOptions& options) {
  check_rotary_options(options);
  // In fp32 and in this order, as Hugging Face computes them, so the tables agree bit for bit.
  const auto exponents =
      torch::arange(0, options.head_dim(), 2, torch::kInt64).to(torch::kFloat32) /
      static_cast<double>(options.head_dim());
  auto inverse = 1.0 / torch::pow(options.theta(), exponents);
  if (options.rope_type() != "llama3") return inverse;
  // Llama 3.1: wavelengths longer than the original context / low_freq_factor slowed by `factor`,
  // shorter than context / high_freq_factor kept, those between interpolated smoothly.
  const double context = static_cast<double>(options.original_max_position_embeddings());
  const double low_wavelength = context / options.low_freq_factor();
  const double high_wavelength = context / options.high_freq_factor();
  const auto wavelength = 2 * M_PI / inverse;
  auto scaled = torch::where(wavelength > low_wavelength, inverse / options.factor(), inverse);
  const auto smooth = (context / wavelength - options.low_freq_factor()) /
                      (options.high_freq_factor() - options.low_freq_factor());
  const auto smoothed = (1 - smooth) * scaled / options.factor() + smooth * scaled;
  const auto medium = (wavelength >= high_wavelength).logical_and(wavelength <= low_wavelength);
  return torch::where(medium, smoothed, scaled);
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
#ifdef PIPETRAIN_HAS_CUDA_KERNELS
  if (kernels_take(x, cos, sin)) return RotaryFunction::apply(x, cos, sin);
#endif
  const auto halves = x.chunk(2, -1);
  const auto rotated = torch::cat({-halves[1], halves[0]}, -1);
  return x * cos + rotated * sin;
}

RotaryEmbeddingImpl::RotaryEmbeddingImpl(const RotaryEmbeddingOptions& options_)
    : options(options_), inverse_frequencies_(rotary_inverse_frequencies(options_)) {}

std::tuple<at::Tensor, at::Tensor> RotaryEmbeddingImpl::tables(int64_t length, c10::Device device,
                                                               at::ScalarType dtype) {
  const std::tuple<int, int, int> key{static_cast<int>(device.type()), device.index(),
                                      static_cast<int>(dtype)};
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = cache_.find(key);
  if (found == cache_.end() || std::get<0>(found->second).size(0) < length) {
    torch::NoGradGuard no_grad;
    const auto inverse = inverse_frequencies_.to(device);
    const auto positions = torch::arange(length, inverse.options());
    // Hugging Face's inv_freq @ positions is a product of one term: the outer product exactly.
    const auto angles = torch::outer(positions, inverse);
    const auto both = torch::cat({angles, angles}, -1);
    found =
        cache_.insert_or_assign(key, std::make_tuple(both.cos().to(dtype), both.sin().to(dtype)))
            .first;
  }
  const auto& [cos, sin] = found->second;
  return {cos.narrow(0, 0, length), sin.narrow(0, 0, length)};
}

std::tuple<at::Tensor, at::Tensor> RotaryEmbeddingImpl::tables_for(const at::Tensor& x,
                                                                   int64_t length) {
  const auto dtype = autocast_enabled(x.device().type()) ? at::kFloat : x.scalar_type();
  return tables(length > 0 ? length : x.size(-2), x.device(), dtype);
}

at::Tensor RotaryEmbeddingImpl::forward(const at::Tensor& x) {
  const auto [cos, sin] = tables_for(x);
  return apply_rotary(x, cos, sin);
}

std::tuple<at::Tensor, at::Tensor> RotaryEmbeddingImpl::rotate(const at::Tensor& q,
                                                               const at::Tensor& k,
                                                               std::optional<at::ScalarType> dtype,
                                                               const at::Tensor& positions,
                                                               int64_t positions_below) {
  auto [cos, sin] = tables_for(q, positions.defined() ? positions_below : 0);
  if (positions.defined()) {
    // Each row's own positions: the tables' rows gathered to [B, 1, T, head_dim], which broadcast
    // over the heads (ATen's ops below; the kernels take one table for every row).
    const auto rows = [&](const at::Tensor& table) {
      return table.index_select(0, positions.reshape(-1))
          .view({positions.size(0), 1, positions.size(1), table.size(1)});
    };
    cos = rows(cos);
    sin = rows(sin);
  }
#ifdef PIPETRAIN_HAS_CUDA_KERNELS
  const auto rotated_type = dtype.value_or(cos.scalar_type());
  if (kernels_take(q, cos, sin) && kernels_take(k, cos, sin) && k.size(0) == q.size(0) &&
      k.scalar_type() == q.scalar_type() && kernels_give(q, cos, rotated_type)) {
    const auto rotated = RotaryPairFunction::apply(q, k, cos, sin, rotated_type);
    return {rotated[0], rotated[1]};
  }
#endif
  auto rotated_q = apply_rotary(q, cos, sin), rotated_k = apply_rotary(k, cos, sin);
  if (dtype) {
    rotated_q = rotated_q.to(*dtype);
    rotated_k = rotated_k.to(*dtype);
  }
  return {rotated_q, rotated_k};
}

}  // namespace pipetrain::nn
