// Rotary position embeddings (Su et al. 2021) in Hugging Face's convention ("rotate half": the
// first and second halves of each head's features are the pairs rotated, not interleaved
// neighbours), with the frequency scalings Llama 3.1 introduced.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>

namespace pipetrain::nn {

struct RotaryEmbeddingOptions {
  /* implicit */ RotaryEmbeddingOptions(int64_t head_dim = 0) : head_dim_(head_dim) {}
  // Features per head rotated (all of them; even).
  TORCH_ARG(int64_t, head_dim);
  // The base of the frequencies: theta^(-2i / head_dim).
  TORCH_ARG(double, theta) = 10000.0;
  // "default", or "llama3": Llama 3.1's scaling of the low frequencies, by the four below.
  TORCH_ARG(std::string, rope_type) = "default";
  TORCH_ARG(double, factor) = 8.0;
  TORCH_ARG(double, low_freq_factor) = 1.0;
  TORCH_ARG(double, high_freq_factor) = 4.0;
  TORCH_ARG(int64_t, original_max_position_embeddings) = 8192;
};

// Throws std::invalid_argument naming what does not fit (an odd head_dim, a rope_type other than
// default and llama3, a scaling whose high_freq_factor is not above low_freq_factor).
void check_rotary_options(const RotaryEmbeddingOptions& options);

// The inverse frequencies [head_dim / 2], fp32 on the CPU: Hugging Face's
// _compute_default_rope_parameters and _compute_llama3_parameters.
at::Tensor rotary_inverse_frequencies(const RotaryEmbeddingOptions& options);

// x [B, H, T, head_dim] rotated by position: x * cos + rotate_half(x) * sin, cos and sin [T,
// head_dim] in x's dtype.
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// Holds no parameters (nothing saved): cos and sin tables, computed in fp32 and cached per device,
// dtype and length (the longest asked for, sliced for shorter sequences).
class RotaryEmbeddingImpl : public torch::nn::Module {
 public:
  explicit RotaryEmbeddingImpl(const RotaryEmbeddingOptions& options);

  // {cos, sin} of positions 0..length-1, [length, head_dim], on `device` in `dtype`.
  std::tuple<at::Tensor, at::Tensor> tables(int64_t length, c10::Device device,
                                            at::ScalarType dtype);
  // q or k [B, H, T, head_dim] rotated by positions 0..T-1, with tables in x's dtype; under
  // autocast in fp32 (a bf16 x comes out fp32), as Hugging Face's and torchtitan's Llama do: their
  // tables take the dtype of the residual stream, fp32 under autocast.
  at::Tensor forward(const at::Tensor& x);
  // q and k both, as forward() each, the tables looked up once; where `dtype` is given (q's own
  // or the tables'), each result then cast to it, in the same pass on a GPU. Attention asks for
  // autocast's dtype, into which attention itself would cast fp32 results at once. `positions`
  // [B, T], where defined, are each token's own (packed documents: pipetrain/nn/documents.h;
  // tokens after a key/value cache's) instead of 0..T-1, all below `positions_below` (0: T).
  std::tuple<at::Tensor, at::Tensor> rotate(const at::Tensor& q, const at::Tensor& k,
                                            std::optional<at::ScalarType> dtype = std::nullopt,
                                            const at::Tensor& positions = {},
                                            int64_t positions_below = 0);

  RotaryEmbeddingOptions options;

 private:
  // The tables forward() rotates `x` by: `length` positions (0: x's T).
  std::tuple<at::Tensor, at::Tensor> tables_for(const at::Tensor& x, int64_t length = 0);

  at::Tensor inverse_frequencies_;
  std::mutex mutex_;  // stages may run on threads of one process
  // By device type, device index and dtype.
  std::map<std::tuple<int, int, int>, std::tuple<at::Tensor, at::Tensor>> cache_;
};
TORCH_MODULE(RotaryEmbedding);

}  // namespace pipetrain::nn
