// The backward split into its input half and its weight half must give exactly what one whole
// backward gives: the inputs' gradients from the first half alone, the parameters' from the two
// together, none counted twice. Graphs below cover what layers do: Linear chains, a weight used
// twice, parameters combined before they meet the input, a node with several outputs (split), an
// output no input contributed to. Tolerance: fp32, 1e-6 (the same kernels run, in another order).
#include "../../src/pipeline/split_backward.h"  // internal: the split itself is tested here

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

namespace pipetrain::split_backward_test {
namespace {

// A stage's forward: outputs from its input and parameters.
using Forward = std::function<std::vector<at::Tensor>(const at::Tensor& input,
                                                      const std::vector<at::Tensor>& params)>;

struct Case {
  std::string name;
  std::vector<int64_t> param_shape;
  int64_t params;
  Forward forward;
};

std::vector<at::Tensor> make_params(const Case& c) {
  torch::manual_seed(3);
  std::vector<at::Tensor> params;
  for (int64_t i = 0; i < c.params; ++i) {
    params.push_back(torch::randn(c.param_shape).requires_grad_(true));
  }
  return params;
}

std::vector<at::Tensor> output_grads(const std::vector<at::Tensor>& outputs) {
  torch::manual_seed(5);
  std::vector<at::Tensor> grads;
  for (const auto& out : outputs) grads.push_back(torch::randn_like(out));
  return grads;
}

std::vector<Case> cases() {
  auto linear = [](const at::Tensor& x, const at::Tensor& w) { return at::linear(x, w); };
  return {
      {"linear_chain",
       {6, 6},
       3,
       [=](const at::Tensor& x, const std::vector<at::Tensor>& p) {
         return std::vector<at::Tensor>{
             linear(torch::tanh(linear(torch::relu(linear(x, p[0])), p[1])), p[2])};
       }},
      {"weight_used_twice",
       {6, 6},
       1,
       [=](const at::Tensor& x, const std::vector<at::Tensor>& p) {
         return std::vector<at::Tensor>{linear(torch::tanh(linear(x, p[0])), p[0])};
       }},
      {"parameters_combined_first",
       {6, 6},
       2,
       [=](const at::Tensor& x, const std::vector<at::Tensor>& p) {
         return std::vector<at::Tensor>{linear(x, p[0] * p[1] + p[1])};
       }},
      {"split_outputs",
       {6, 6},
       3,
       [=](const at::Tensor& x, const std::vector<at::Tensor>& p) {
         auto parts = linear(x, p[0]).split(3, 1);
         return std::vector<at::Tensor>{parts[0] * p[1].narrow(1, 0, 3) +
                                        parts[1] * p[2].narrow(1, 3, 3)};
       }},
      {"output_without_input",
       {6, 6},
       2,
       [=](const at::Tensor& x, const std::vector<at::Tensor>& p) {
         return std::vector<at::Tensor>{linear(x, p[0]), p[1] * 2.0};
       }},
  };
}

class SplitBackward : public ::testing::TestWithParam<Case> {};

TEST_P(SplitBackward, BothHalvesTogetherEqualOneWholeBackward) {
  const Case& c = GetParam();
  const at::Tensor data = torch::randn({6, 6});

  // Reference: one whole backward.
  auto whole_params = make_params(c);
  const at::Tensor whole_input = data.clone().requires_grad_(true);
  const auto whole_outputs = c.forward(whole_input, whole_params);
  torch::autograd::backward(whole_outputs, output_grads(whole_outputs));

  auto params = make_params(c);
  const at::Tensor input = data.clone().requires_grad_(true);
  const auto outputs = c.forward(input, params);
  std::vector<at::Tensor> input_grads;
  WeightBackward rest =
      WeightBackward::input_backward(outputs, output_grads(outputs), {input}, &input_grads);
  ASSERT_EQ(input_grads.size(), 1u);
  EXPECT_TRUE(torch::allclose(input_grads[0], whole_input.grad(), 1e-6, 1e-6));
  EXPECT_FALSE(input.grad().defined()) << "the first half returns the input's gradient";
  for (const auto& p : params) {
    EXPECT_FALSE(p.grad().defined()) << "the first half must leave the parameters to the second";
  }

  rest.run();
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(params[i].grad().defined()) << "parameter " << i;
    EXPECT_TRUE(torch::allclose(params[i].grad(), whole_params[i].grad(), 1e-6, 1e-6))
        << "parameter " << i << " differs by "
        << (params[i].grad() - whole_params[i].grad()).abs().max().item<double>();
  }
  rest.run();  // runs once: a second call adds nothing
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(params[i].grad(), whole_params[i].grad(), 1e-6, 1e-6));
  }
}

INSTANTIATE_TEST_SUITE_P(Graphs, SplitBackward, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// On a GPU (the engine runs CUDA nodes on its device threads): a Linear chain in fp32.
TEST(SplitBackwardCuda, BothHalvesTogetherEqualOneWholeBackward) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto device = torch::Device(torch::kCUDA);
  torch::manual_seed(3);
  std::vector<at::Tensor> whole, split;
  for (int i = 0; i < 3; ++i) whole.push_back(torch::randn({64, 64}, device).requires_grad_(true));
  for (const auto& w : whole) split.push_back(w.detach().clone().requires_grad_(true));
  const at::Tensor data = torch::randn({32, 64}, device), grad = torch::randn({32, 64}, device);
  auto forward = [](const at::Tensor& x, const std::vector<at::Tensor>& p) {
    return at::linear(torch::gelu(at::linear(torch::tanh(at::linear(x, p[0])), p[1])), p[2]);
  };
  const at::Tensor x_whole = data.clone().requires_grad_(true);
  torch::autograd::backward({forward(x_whole, whole)}, {grad});
  const at::Tensor x = data.clone().requires_grad_(true);
  std::vector<at::Tensor> input_grads;
  WeightBackward rest =
      WeightBackward::input_backward({forward(x, split)}, {grad}, {x}, &input_grads);
  EXPECT_TRUE(torch::allclose(input_grads[0], x_whole.grad(), 1e-5, 1e-5));
  rest.run();
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_TRUE(torch::allclose(split[i].grad(), whole[i].grad(), 1e-5, 1e-5)) << "parameter " << i;
  }
}

TEST(SplitBackwardLoss, AScalarRootNeedsNoGradientAndOthersAreRefused) {
  const at::Tensor w = torch::randn({4, 4}).requires_grad_(true);
  const at::Tensor x = torch::randn({2, 4}).requires_grad_(true);
  std::vector<at::Tensor> grads;
  WeightBackward rest = WeightBackward::input_backward({at::linear(x, w).sum()}, {}, {x}, &grads);
  rest.run();
  EXPECT_TRUE(torch::allclose(grads[0], w.sum(0).expand({2, 4}), 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(w.grad(), x.sum(0).expand({4, 4}).detach(), 1e-6, 1e-6));
  EXPECT_THROW(WeightBackward::input_backward({at::linear(x, w)}, {}, {x}, &grads),
               std::invalid_argument);
}

}  // namespace
}  // namespace pipetrain::split_backward_test
