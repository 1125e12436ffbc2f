// What CUDA graphs ask autograd before capturing a stage (stage_graphs.h), on the CPU: whether a
// stage's backward reads the stage's output, which an in-place loss would have changed.
#include "pipeline/stage_graphs.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace pipetrain::testing::stage_graphs_test {
namespace {

// A Linear's backward reads its input and weight, a Tanh's its output, and so does a Tanh's seen
// through a view of that output; the question leaves the parameters' gradients usable.
TEST(StageGraphs, AskAutogradWhetherABackwardReadsTheOutput) {
  torch::manual_seed(0);
  torch::nn::Linear linear(3, 4);
  const auto x = torch::randn({2, 3});
  EXPECT_FALSE(backward_reads_output(linear(x)));
  EXPECT_TRUE(backward_reads_output(torch::tanh(linear(x))));
  EXPECT_TRUE(backward_reads_output(torch::tanh(linear(x)).flatten()));
  EXPECT_TRUE(backward_reads_output(torch::nn::Sequential(linear, torch::nn::Tanh())->forward(x)));
  linear->zero_grad();
  linear(x).sum().backward();
  EXPECT_TRUE(torch::allclose(linear->bias.grad(), torch::full({4}, 2.0)));
}

}  // namespace
}  // namespace pipetrain::testing::stage_graphs_test
