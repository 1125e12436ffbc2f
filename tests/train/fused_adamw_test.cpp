// FusedAdamW steps as torch::optim::AdamW does, with per-group options, and goes on from state
// loaded into it. On a GPU with Torch 2.x this is the fused kernel against LibTorch's loop
// (fp32: relative 1e-5, absolute 1e-6); elsewhere FusedAdamW takes AdamW's own step, and the test
// checks only that it does. A divisor handed to the next step divides the gradients as an in-place
// division before the step would (the quotients within fp32 rounding: relative 1e-6).
#include "pipetrain/fused_adamw.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>

namespace pipetrain::fused_adamw_test {
namespace {

torch::Device test_device() {
  return torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
}

std::vector<at::Tensor> make_parameters() {
  torch::manual_seed(0);
  std::vector<at::Tensor> parameters{torch::randn({16, 8}), torch::randn({8}),
                                     torch::randn({4, 4})};
  for (auto& p : parameters) p = p.to(test_device()).requires_grad_();
  return parameters;
}

template <typename Optimizer>
std::unique_ptr<Optimizer> make_optimizer(const std::vector<at::Tensor>& parameters) {
  const auto options = torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{parameters[0], parameters[2]},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(options).weight_decay(0.1)));
  groups.emplace_back(std::vector<at::Tensor>{parameters[1]},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(options).weight_decay(0)));
  return std::make_unique<Optimizer>(std::move(groups), options);
}

// Gradients that differ per step and per parameter, the same for every optimizer.
void set_gradients(const std::vector<at::Tensor>& parameters, int step) {
  for (size_t i = 0; i < parameters.size(); ++i) {
    parameters[i].mutable_grad() =
        torch::sin(torch::arange(parameters[i].numel(), parameters[i].options())
                       .reshape(parameters[i].sizes()) *
                   (step + 1) * (static_cast<double>(i) + 0.5))
            .detach();
  }
}

void expect_close(const std::vector<at::Tensor>& expected, const std::vector<at::Tensor>& actual) {
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(torch::allclose(actual[i].cpu(), expected[i].cpu(), 1e-5, 1e-6))
        << "parameter " << i << " differs by "
        << (actual[i] - expected[i]).abs().max().item<double>();
  }
}

// Steps [begin, end) of both optimizers on the same gradients: `reference` on `expected`, `fused`
// on `actual`.
void step_both(torch::optim::Optimizer& reference, const std::vector<at::Tensor>& expected,
               torch::optim::Optimizer& fused, const std::vector<at::Tensor>& actual, int begin,
               int end) {
  for (int step = begin; step < end; ++step) {
    set_gradients(expected, step);
    set_gradients(actual, step);
    reference.step();
    fused.step();
  }
}

TEST(FusedAdamW, StepsAsAdamWWithEachGroupsOptions) {
  const auto expected = make_parameters(), actual = make_parameters();
  auto reference = make_optimizer<torch::optim::AdamW>(expected);
  auto fused = make_optimizer<FusedAdamW>(actual);
  step_both(*reference, expected, *fused, actual, 0, 6);
  expect_close(expected, actual);
  ASSERT_EQ(fused->state().size(), actual.size());
  for (const auto& entry : fused->state()) {
    EXPECT_EQ(static_cast<const torch::optim::AdamWParamState&>(*entry.second).step(), 6);
  }
}

TEST(FusedAdamW, GoesOnFromStateLoadedIntoIt) {
  const auto expected = make_parameters(), actual = make_parameters();
  auto reference = make_optimizer<torch::optim::AdamW>(expected);
  auto first = make_optimizer<FusedAdamW>(actual);
  step_both(*reference, expected, *first, actual, 0, 3);
  std::stringstream saved;
  {
    torch::serialize::OutputArchive archive;
    first->save(archive);
    archive.save_to(saved);
  }
  auto resumed = make_optimizer<FusedAdamW>(actual);
  torch::serialize::InputArchive archive;
  archive.load_from(saved);
  resumed->load(archive);
  step_both(*reference, expected, *resumed, actual, 3, 6);
  expect_close(expected, actual);
}

// divide_gradients_in_next_step: the step is AdamW's on the gradients divided first, and .grad
// holds the quotients afterwards; the step after it divides nothing.
TEST(FusedAdamW, DividesTheNextStepsGradientsAsAnInPlaceDivisionWould) {
  const auto expected = make_parameters(), actual = make_parameters();
  auto reference = make_optimizer<torch::optim::AdamW>(expected);
  auto fused = make_optimizer<FusedAdamW>(actual);
  const auto divisor =
      torch::full({}, 3.5, torch::TensorOptions(torch::kFloat64).device(test_device()));
  for (int step = 0; step < 4; ++step) {
    set_gradients(expected, step);
    set_gradients(actual, step);
    if (step == 1) {
      torch::NoGradGuard no_grad;
      for (auto& p : expected) p.mutable_grad().div_(3.5);
      fused->divide_gradients_in_next_step(divisor);
    }
    reference->step();
    fused->step();
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_TRUE(torch::allclose(actual[i].grad().cpu(), expected[i].grad().cpu(), 1e-6, 1e-7))
          << "step " << step << ", gradient " << i;
    }
  }
  expect_close(expected, actual);
}

}  // namespace
}  // namespace pipetrain::fused_adamw_test
