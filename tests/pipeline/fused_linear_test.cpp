// Gradient-accumulation fusion changes where the adds happen, not what they add up to: a pipe of
// Linear layers trains the same with it as without it (fp32, 1e-6), over several micro-batches.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/pipe.h"
#include "pipetrain/world.h"
#include "support/reference.h"

namespace pipetrain::testing {
namespace {

std::vector<at::Tensor> train(bool fused) {
  auto world = std::make_shared<World>();
  Pipe pipe(make_reference_model(3),
            PipeOptions().chunks(3).checkpoint("never").fuse_gradient_accumulation(fused), world);
  int64_t plain_linears = 0;
  for (const auto& child : pipe.stage_module()->children()) {
    plain_linears += std::dynamic_pointer_cast<torch::nn::LinearImpl>(child) != nullptr;
  }
  EXPECT_EQ(plain_linears, fused ? 0 : 4) << "the fused pipe must not run torch::nn::Linear";
  if (fused) {
    // Linear layers whose input carries a gradient (all but the first, which sees the data)
    // accumulate inside their GEMM.
    auto layer = pipe.stage_module()->begin()[2];
    const auto out = layer.forward(torch::ones({2, 16}, torch::requires_grad()));
    EXPECT_NE(out.grad_fn()->name().find("LinearAccumulatingGrad"), std::string::npos)
        << out.grad_fn()->name();
  }
  torch::optim::SGD optimizer(pipe.parameters(), torch::optim::SGDOptions(kLearningRate));
  std::vector<at::Tensor> result;
  for (int64_t step = 0; step < kSteps; ++step) {
    const auto [inputs, targets] = reference_batch(step);
    optimizer.zero_grad();
    pipe.forward_backward(inputs, kBatchSize, [&](const at::Tensor& out, const MicroBatch& mb) {
      return torch::mse_loss(out, targets.slice(0, mb.begin, mb.end));
    });
    if (step == 0) {
      for (const auto& p : pipe.parameters()) result.push_back(p.grad().clone());
    }
    optimizer.step();
  }
  for (const auto& p : pipe.parameters()) result.push_back(p.detach().clone());
  return result;
}

TEST(FusedGradientAccumulation, TrainsLikeSeparateAccumulation) {
  const auto expected = train(false);
  const auto actual = train(true);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(torch::allclose(actual[i], expected[i], 1e-6, 1e-7))
        << (i < expected.size() / 2 ? "gradient " : "parameter ") << i % (expected.size() / 2);
  }
}

}  // namespace
}  // namespace pipetrain::testing
