#include "pipetrain/balance.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "stage_value.h"

namespace pipetrain {
std::string format_balance(const std::vector<int64_t>& balance) {
  std::ostringstream out;
  for (size_t i = 0; i < balance.size(); ++i) out << (i ? "," : "") << balance[i];
  return out.str();
}

void validate_balance(const std::vector<int64_t>& balance, int64_t layers) {
  if (balance.empty()) throw std::invalid_argument("balance is empty: give one entry per stage");
  int64_t sum = 0;
  for (size_t i = 0; i < balance.size(); ++i) {
    if (balance[i] <= 0) {
      throw std::invalid_argument("balance " + format_balance(balance) + " gives stage " +
                                  std::to_string(i) + " " + std::to_string(balance[i]) +
                                  " layers: every stage needs at least one layer");
    }
    sum += balance[i];
  }
  if (sum != layers) {
    throw std::invalid_argument("balance " + format_balance(balance) + " sums to " +
                                std::to_string(sum) + " but the model has " +
                                std::to_string(layers) +
                                " layers: the entries must add up to the number of layers");
  }
}

std::vector<int64_t> balance_by_cost(const std::vector<double>& costs, int64_t stages) {
  const auto n = static_cast<int64_t>(costs.size());
  if (stages < 1 || stages > n) {
    throw std::invalid_argument("cannot split " + std::to_string(n) + " layers into " +
                                std::to_string(stages) +
                                " stages: every stage needs at least one layer");
  }
  std::vector<double> prefix(n + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];

  // best[k][i]: the (largest stage cost, largest layer count) of the best split of the first i
  // layers into k stages; cut[k][i] is where its last stage begins.
  using Score = std::pair<double, int64_t>;
  const Score infinite{std::numeric_limits<double>::infinity(), 0};
  std::vector<std::vector<Score>> best(stages + 1, std::vector<Score>(n + 1, infinite));
  std::vector<std::vector<int64_t>> cut(stages + 1, std::vector<int64_t>(n + 1, 0));
  best[0][0] = {0.0, 0};
  for (int64_t k = 1; k <= stages; ++k) {
    for (int64_t i = k; i <= n; ++i) {
      for (int64_t j = k - 1; j < i; ++j) {
        if (best[k - 1][j] == infinite) continue;
        const Score candidate{std::max(best[k - 1][j].first, prefix[i] - prefix[j]),
                              std::max(best[k - 1][j].second, i - j)};
        if (candidate < best[k][i]) {
          best[k][i] = candidate;
          cut[k][i] = j;
        }
      }
    }
  }
  std::vector<int64_t> balance(stages);
  for (int64_t k = stages, i = n; k >= 1; --k) {
    balance[k - 1] = i - cut[k][i];
    i = cut[k][i];
  }
  return balance;
}

std::vector<int64_t> balance_by_size(const torch::nn::Sequential& sequential, int64_t stages) {
  std::vector<double> costs;
  for (const auto& layer : sequential->children()) {
    double elements = 0;
    for (const auto& p : layer->parameters()) elements += static_cast<double>(p.numel());
    costs.push_back(elements);
  }
  return balance_by_cost(costs, stages);
}

std::vector<int64_t> balance_by_time(torch::nn::Sequential sequential, const at::Tensor& sample,
                                     int64_t stages, int repeats) {
  if (repeats < 1) {
    throw std::invalid_argument("balance_by_time needs at least 1 timed run per layer, got " +
                                std::to_string(repeats));
  }
  std::vector<torch::nn::AnyModule> layers(sequential->begin(), sequential->end());
  const auto count = static_cast<int64_t>(layers.size());

  // Each layer's input, as training feeds it: the output of the layer before.
  std::vector<StageValue> inputs{StageValue::of(sample)};
  {
    torch::NoGradGuard no_grad;
    for (int64_t index = 0; index + 1 < count; ++index) {
      inputs.push_back(StageValue::unpack(layers[index].any_forward(inputs.back().pack()), index));
    }
  }

  // One forward + backward of layer `index`, in seconds.
  const bool cuda = sample.is_cuda();
  auto time_layer = [&](int64_t index) {
    StageValue x = inputs[index];
    for (auto& t : x.tensors) {
      t = t.detach();
      if (t.is_floating_point()) t.requires_grad_(true);
    }
    if (cuda) torch::cuda::synchronize();
    const auto start = std::chrono::steady_clock::now();
    const auto output = StageValue::unpack(layers[index].any_forward(x.pack()), index);
    std::vector<at::Tensor> roots, grads;
    for (const auto& t : output.tensors) {
      if (!t.requires_grad()) continue;
      roots.push_back(t);
      grads.push_back(torch::ones_like(t));
    }
    if (!roots.empty()) torch::autograd::backward(roots, grads);
    if (cuda) torch::cuda::synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };

  // Rounds over all layers rather than each layer's runs back to back: a burst of load from
  // another process then slows one run of every layer instead of every run of one layer. Load
  // only ever adds time, so each layer's fastest run is its cost. Round 0 warms up.
  std::vector<double> costs(count, std::numeric_limits<double>::infinity());
  for (int r = 0; r <= repeats; ++r) {
    for (int64_t index = 0; index < count; ++index) {
      const double seconds = time_layer(index);
      if (r > 0) costs[index] = std::min(costs[index], seconds);
    }
  }
  sequential->zero_grad();
  return balance_by_cost(costs, stages);
}

}  // namespace pipetrain
