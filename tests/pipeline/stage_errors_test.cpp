// A layer of one's own that throws inside a stage: the error names that layer (its index in the
// Sequential and its type), and sends the user to the balance only where the stage's first layer
// refuses what the previous stage sent. One process running two stages (virtual stages), so the
// second stage's errors are seen without launching ranks.
#include <gtest/gtest.h>
#include <pipetrain/pipetrain.h>
#include <torch/torch.h>

#include <stdexcept>
#include <string>

#include "support/errors.h"

namespace pipetrain::testing::stage_errors_test {
namespace {

// A user's layer that refuses inputs with negative values, as a layer of one's own may.
struct RejectNegativeImpl : torch::nn::Module {
  at::Tensor forward(const at::Tensor& x) {
    if (x.min().item<double>() < 0) throw std::domain_error("negative input");
    return x;
  }
};
TORCH_MODULE(RejectNegative);

// Stages [0, 1] and [2, 3] of the Sequential, both on this process.
std::string error_of_step(torch::nn::Sequential model) {
  Pipe pipe(model,
            PipeOptions().balance({2, 2}).virtual_stages(2).schedule("interleaved1f1b").chunks(1),
            std::make_shared<World>());
  return error_of([&] {
    pipe.forward_backward(torch::randn({4, 4}), 4,
                          [](const at::Tensor& out, const MicroBatch&) { return out.sum(); });
  });
}

TEST(StageErrors, ALayerThatThrowsInsideAStageIsNamedAndTheBalanceIsNotBlamed) {
  torch::manual_seed(0);
  const std::string message = error_of_step(torch::nn::Sequential(
      torch::nn::Linear(4, 8), torch::nn::Tanh(), torch::nn::Linear(8, 8), RejectNegative()));
  EXPECT_NE(message.find("stage 1"), std::string::npos) << message;
  EXPECT_NE(message.find("layer 3 ("), std::string::npos) << message;
  EXPECT_NE(message.find("RejectNegative"), std::string::npos) << message;
  EXPECT_NE(message.find("negative input"), std::string::npos) << message;
  EXPECT_EQ(message.find("balance"), std::string::npos) << message;
}

TEST(StageErrors, AShapeMismatchAtAStageBoundaryPointsToTheBalance) {
  const std::string message = error_of_step(torch::nn::Sequential(
      torch::nn::Linear(4, 8), torch::nn::Tanh(), torch::nn::Linear(16, 8), torch::nn::Tanh()));
  EXPECT_NE(message.find("layer 2 ("), std::string::npos) << message;
  EXPECT_NE(message.find("from stage 0"), std::string::npos) << message;
  EXPECT_NE(message.find("--balance"), std::string::npos) << message;
}

}  // namespace
}  // namespace pipetrain::testing::stage_errors_test
