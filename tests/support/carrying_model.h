// A Sequential whose layers pass several tensors on: a tuple (and a std::vector) of a hidden
// tensor, a skip connection made on the first layer and used on the fourth, an int64 mask (no
// gradient) and the raw input (no graph). Takes and returns what reference.h's batches hold
// (6 features in, 3 out), so train_single_process() trains it in one process.
#pragma once

#include <torch/torch.h>

#include <tuple>
#include <vector>

namespace pipetrain::testing {

using Carried = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;  // h, skip, mask, x

// Layer 0: the input as (hidden, skip, mask, input).
struct SplitImpl : torch::nn::Module {
  SplitImpl();
  Carried forward(const at::Tensor& x);
  torch::nn::Linear hidden, skip;
};
TORCH_MODULE(Split);

// Layer 1: works on the hidden tensor, passes the others on untouched (the same tensors).
struct BlockImpl : torch::nn::Module {
  BlockImpl();
  Carried forward(const Carried& in);
  torch::nn::Linear linear;
};
TORCH_MODULE(Block);

// Layer 2: the same, returning a std::vector.
struct VectorBlockImpl : torch::nn::Module {
  VectorBlockImpl();
  std::vector<at::Tensor> forward(const Carried& in);
  torch::nn::Linear linear;
};
TORCH_MODULE(VectorBlock);

// Layer 3: joins them again, the mask scaling the skip connection row by row.
struct MergeImpl : torch::nn::Module {
  at::Tensor forward(const std::vector<at::Tensor>& in);
};
TORCH_MODULE(Merge);

constexpr int64_t kCarryingLayers = 5;

// Split, Block, VectorBlock, Merge, Linear(30, 3), initialised from `seed`.
torch::nn::Sequential carrying_model(uint64_t seed = 11);

}  // namespace pipetrain::testing
