#include "support/carrying_model.h"

namespace pipetrain::testing {

SplitImpl::SplitImpl()
    : hidden(register_module("hidden", torch::nn::Linear(6, 16))),
      skip(register_module("skip", torch::nn::Linear(6, 8))) {}

Carried SplitImpl::forward(const at::Tensor& x) {
  return {torch::tanh(hidden(x)), torch::tanh(skip(x)), (x.select(1, 0) > 0).to(torch::kInt64), x};
}

BlockImpl::BlockImpl() : linear(register_module("linear", torch::nn::Linear(16, 16))) {}

Carried BlockImpl::forward(const Carried& in) {
  const auto& [h, skip, mask, x] = in;
  return {torch::tanh(linear(h)), skip, mask, x};
}

VectorBlockImpl::VectorBlockImpl() : linear(register_module("linear", torch::nn::Linear(16, 16))) {}

std::vector<at::Tensor> VectorBlockImpl::forward(const Carried& in) {
  const auto& [h, skip, mask, x] = in;
  return {torch::tanh(linear(h)) + 0.5 * h, skip, mask, x};
}

at::Tensor MergeImpl::forward(const std::vector<at::Tensor>& in) {
  const auto scale = (in[2] + 1).unsqueeze(1).to(in[0].scalar_type());
  return torch::cat({in[0], in[1] * scale, in[3]}, 1);
}

torch::nn::Sequential carrying_model(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(Split(), Block(), VectorBlock(), Merge(),
                               torch::nn::Linear(16 + 8 + 6, 3));
}

}  // namespace pipetrain::testing
