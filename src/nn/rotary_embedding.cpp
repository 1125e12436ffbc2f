#include "pipetrain/nn/rotary_embedding.h"

#include <torch/torch.h>

#include <cmath>
#include <stdexcept>

#include "util/compat.h"

namespace pipetrain::nn {

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

std::tuple<at::Tensor, at::Tensor> RotaryEmbeddingImpl::tables_for(const at::Tensor& x) {
  const auto dtype = autocast_enabled(x.device().type()) ? at::kFloat : x.scalar_type();
  return tables(x.size(-2), x.device(), dtype);
}

at::Tensor RotaryEmbeddingImpl::forward(const at::Tensor& x) {
  const auto [cos, sin] = tables_for(x);
  return apply_rotary(x, cos, sin);
}

std::tuple<at::Tensor, at::Tensor> RotaryEmbeddingImpl::rotate(const at::Tensor& q,
                                                               const at::Tensor& k) {
  const auto [cos, sin] = tables_for(q);
  return {apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)};
}

}  // namespace pipetrain::nn
