// Choosing how many consecutive layers each stage gets. Both functions minimise the cost of the
// most expensive stage (the pipeline runs at the pace of its slowest stage), breaking ties by the
// largest layer count, so a parameter-free activation stays with the layer before it.
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain {

// Contiguous split of `costs` into `stages` non-empty parts minimising the largest part's sum.
std::vector<int64_t> balance_by_cost(const std::vector<double>& costs, int64_t stages);

// Cost of a layer = its number of parameter elements.
std::vector<int64_t> balance_by_size(const torch::nn::Sequential& sequential, int64_t stages);

// Cost of a layer = its measured forward + backward time on `sample` (the fastest of `repeats`
// runs, after one warm-up; the runs go round all layers so a burst of load slows no layer's every
// run), the output of each layer feeding the next as in training (one no-grad forward's outputs,
// held at once).
std::vector<int64_t> balance_by_time(torch::nn::Sequential sequential, const at::Tensor& sample,
                                     int64_t stages, int repeats = 5);

// "7,8": a balance as --balance takes it.
std::string format_balance(const std::vector<int64_t>& balance);

// Throws std::invalid_argument naming the value when `balance` does not describe `layers` layers
// in non-empty stages.
void validate_balance(const std::vector<int64_t>& balance, int64_t layers);

}  // namespace pipetrain
