// Small helpers shared by the benchmarks in this folder: the MLP they train, a median, and the
// "run me as a pipeline stage" dispatch on top of pipetrain's local launcher. Header-only so that
// bench/CMakeLists.txt can keep building one executable per *_bench.cpp.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace pipetrain::bench {

// `blocks` x (Linear(width, width) + ReLU): 2 * blocks layers, the same weights for every seed.
inline torch::nn::Sequential make_mlp(int64_t blocks, int64_t width, uint64_t seed = 1) {
  torch::manual_seed(seed);
  torch::nn::Sequential mlp;
  for (int64_t b = 0; b < blocks; ++b) {
    mlp->push_back(torch::nn::Linear(width, width));
    mlp->push_back(torch::nn::ReLU());
  }
  return mlp;
}

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

inline std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value ? value : fallback;
}

inline void zero_grad(const std::vector<at::Tensor>& parameters) {
  for (const auto& p : parameters) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
}

}  // namespace pipetrain::bench
