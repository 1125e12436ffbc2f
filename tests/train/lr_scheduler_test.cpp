// WarmupDecayLR's rates against values worked out by hand from the formulas nanoGPT and llm.c
// use (written out below, not computed by the code under test), its state a single counter that
// restores the same rates, and its arguments refused with their values.
#include "pipetrain/lr_scheduler.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>

#include "support/errors.h"

namespace pipetrain::testing::lr_scheduler_test {
namespace {

// An optimizer of one param group per rate, each holding a parameter of its own.
struct Optimizer {
  explicit Optimizer(const std::vector<double>& lrs) {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    for (double lr : lrs) {
      parameters.push_back(torch::zeros({2}, torch::requires_grad()));
      groups.emplace_back(std::vector<at::Tensor>{parameters.back()},
                          std::make_unique<torch::optim::AdamWOptions>(lr));
    }
    optimizer = std::make_unique<torch::optim::AdamW>(std::move(groups));
  }
  double lr(size_t group = 0) const {
    return get_learning_rate(optimizer->param_groups().at(group));
  }
  std::vector<at::Tensor> parameters;
  std::unique_ptr<torch::optim::AdamW> optimizer;
};

// The rate `scheduler` gives step `count`.
double lr_at(LRScheduler& scheduler, const Optimizer& optimizer, int64_t count, size_t group = 0) {
  scheduler.set_step_count(count);
  return optimizer.lr(group);
}

// Warmup 4, decay to 1e-4 by step 14 from 1e-3: t = (count - 4) / 10 after warmup.
constexpr double kBase = 1e-3;
constexpr double kMin = 1e-4;
constexpr double kTolerance = 1e-12;

TEST(WarmupDecayLR, WarmsUpLinearlyFromTheFirstStep) {
  for (const std::string shape : {"constant", "cosine", "linear"}) {
    SCOPED_TRACE(shape);
    Optimizer optimizer({kBase});
    WarmupDecayLR scheduler(*optimizer.optimizer, shape, 4, 14, kMin);
    // Step 0's rate is set on construction, before any step().
    EXPECT_NEAR(optimizer.lr(), 2.5e-4, kTolerance);  // 1e-3 x 1 / 4
    scheduler.step();
    EXPECT_NEAR(optimizer.lr(), 5e-4, kTolerance);  // 1e-3 x 2 / 4
    EXPECT_NEAR(lr_at(scheduler, optimizer, 2), 7.5e-4, kTolerance);
    EXPECT_NEAR(lr_at(scheduler, optimizer, 3), 1e-3, kTolerance);  // the last warmup step: base
    EXPECT_NEAR(lr_at(scheduler, optimizer, 4), 1e-3, kTolerance);  // t = 0
  }
}

TEST(WarmupDecayLR, CosineFollowsHalfACosineToTheMinimumAndStaysThere) {
  Optimizer optimizer({kBase});
  WarmupDecayLR scheduler(*optimizer.optimizer, "cosine", 4, 14, kMin);
  // t = 0.2: 1e-4 + 9e-4 x 0.5 x (1 + cos(0.2 pi)) = 1e-4 + 9e-4 x 0.904508497 = 9.14057647e-4
  EXPECT_NEAR(lr_at(scheduler, optimizer, 6), 9.14057647e-4, 1e-12);
  EXPECT_NEAR(lr_at(scheduler, optimizer, 9), 5.5e-4, kTolerance);  // t = 0.5: halfway
  // t = 0.9: 1e-4 + 9e-4 x 0.5 x (1 + cos(0.9 pi)) = 1e-4 + 9e-4 x 0.024471742 = 1.22024568e-4
  EXPECT_NEAR(lr_at(scheduler, optimizer, 13), 1.22024568e-4, 1e-12);
  EXPECT_NEAR(lr_at(scheduler, optimizer, 14), kMin, kTolerance);
  EXPECT_NEAR(lr_at(scheduler, optimizer, 1000), kMin, kTolerance);
}

TEST(WarmupDecayLR, NanoGptsDefaultsGiveItsHalfwayRate) {
  // nanoGPT's train.py: learning_rate 6e-4, min_lr 6e-5, warmup_iters 2000, lr_decay_iters
  // 600000; at iteration 301000 its decay_ratio is 299000 / 598000 = 0.5, so 6e-5 + 0.5 x 5.4e-4.
  Optimizer optimizer({6e-4});
  WarmupDecayLR scheduler(*optimizer.optimizer, "cosine", 2000, 600000, 6e-5);
  EXPECT_NEAR(lr_at(scheduler, optimizer, 301000), 3.3e-4, kTolerance);
}

TEST(WarmupDecayLR, LinearFallsInEqualStepsToTheMinimum) {
  Optimizer optimizer({kBase});
  WarmupDecayLR scheduler(*optimizer.optimizer, "linear", 4, 14, kMin);
  EXPECT_NEAR(lr_at(scheduler, optimizer, 6), 8.2e-4, kTolerance);   // 1e-4 + 9e-4 x 0.8
  EXPECT_NEAR(lr_at(scheduler, optimizer, 9), 5.5e-4, kTolerance);   // 1e-4 + 9e-4 x 0.5
  EXPECT_NEAR(lr_at(scheduler, optimizer, 11), 3.7e-4, kTolerance);  // 1e-4 + 9e-4 x 0.3
  EXPECT_NEAR(lr_at(scheduler, optimizer, 14), kMin, kTolerance);
  EXPECT_NEAR(lr_at(scheduler, optimizer, 20), kMin, kTolerance);
}

TEST(WarmupDecayLR, ConstantKeepsTheRateAfterWarmup) {
  Optimizer optimizer({kBase});
  // decay_steps and min_lr are not used: 0 is allowed.
  WarmupDecayLR scheduler(*optimizer.optimizer, "constant", 4);
  EXPECT_NEAR(lr_at(scheduler, optimizer, 0), 2.5e-4, kTolerance);
  EXPECT_NEAR(lr_at(scheduler, optimizer, 4), kBase, kTolerance);
  EXPECT_NEAR(lr_at(scheduler, optimizer, 100000), kBase, kTolerance);
  // No warmup: the optimizer's own rate from step 0.
  Optimizer plain({kBase});
  WarmupDecayLR unchanged(*plain.optimizer, "constant", 0);
  EXPECT_NEAR(plain.lr(), kBase, kTolerance);
}

TEST(WarmupDecayLR, MinLrIsTheFirstGroupsAndTheOthersKeepTheirRatio) {
  Optimizer optimizer({kBase, 2e-3});
  WarmupDecayLR scheduler(*optimizer.optimizer, "cosine", 4, 14, kMin);
  EXPECT_NEAR(lr_at(scheduler, optimizer, 0, 1), 5e-4, kTolerance);    // 2e-3 x 1 / 4
  EXPECT_NEAR(lr_at(scheduler, optimizer, 9, 1), 1.1e-3, kTolerance);  // 2e-4 + 1.8e-3 x 0.5
  EXPECT_NEAR(lr_at(scheduler, optimizer, 14, 1), 2e-4, kTolerance);
  EXPECT_NEAR(optimizer.lr(0), kMin, kTolerance);
}

TEST(WarmupDecayLR, ARestoredStepCountGivesTheRatesOfAnUninterruptedRun) {
  Optimizer whole({kBase});
  WarmupDecayLR uninterrupted(*whole.optimizer, "cosine", 4, 14, kMin);
  for (int i = 0; i < 7; ++i) uninterrupted.step();
  EXPECT_EQ(uninterrupted.step_count(), 7);
  // t = 0.3: 1e-4 + 9e-4 x 0.5 x (1 + cos(0.3 pi)) = 1e-4 + 9e-4 x 0.793892626 = 8.14503364e-4
  EXPECT_NEAR(whole.lr(), 8.14503364e-4, 1e-12);

  // A fresh optimizer and scheduler, as a resumed run makes them, given the saved count.
  Optimizer resumed({kBase});
  WarmupDecayLR restored(*resumed.optimizer, "cosine", 4, 14, kMin);
  restored.set_step_count(uninterrupted.step_count());
  EXPECT_EQ(restored.step_count(), 7);
  EXPECT_DOUBLE_EQ(resumed.lr(), whole.lr());
  for (int i = 0; i < 3; ++i) {
    uninterrupted.step();
    restored.step();
    EXPECT_DOUBLE_EQ(resumed.lr(), whole.lr());
  }
  EXPECT_EQ(restored.last_lr(), uninterrupted.last_lr());
}

TEST(WarmupDecayLR, BadArgumentsAreRefusedWithTheirValues) {
  Optimizer optimizer({kBase});
  auto& adamw = *optimizer.optimizer;
  const auto unknown = error_of<std::invalid_argument>([&] { WarmupDecayLR(adamw, "cosin", 4); });
  EXPECT_NE(unknown.find("shape 'cosin' is not one of constant, cosine, linear"), std::string::npos)
      << unknown;
  const auto empty = error_of<std::invalid_argument>([&] { WarmupDecayLR(adamw, "cosine", 10); });
  EXPECT_NE(empty.find("to decay_steps (0), which must be later"), std::string::npos) << empty;
  const auto equal =
      error_of<std::invalid_argument>([&] { WarmupDecayLR(adamw, "linear", 10, 10); });
  EXPECT_NE(equal.find("(step 10) to decay_steps (10)"), std::string::npos) << equal;
  const auto negative =
      error_of<std::invalid_argument>([&] { WarmupDecayLR(adamw, "constant", -1); });
  EXPECT_NE(negative.find("warmup_steps (-1)"), std::string::npos) << negative;
  const auto high =
      error_of<std::invalid_argument>([&] { WarmupDecayLR(adamw, "cosine", 0, 10, 0.01); });
  EXPECT_NE(high.find("min_lr 0.01 must be between 0 and the learning rate 0.001"),
            std::string::npos)
      << high;
  // A refused scheduler left the optimizer's rate alone.
  EXPECT_EQ(optimizer.lr(), kBase);
}

}  // namespace
}  // namespace pipetrain::testing::lr_scheduler_test
