// The bytes a schedule makes each rank hold, walked action by action, against counts made by hand
// for GPipe and 1F1B under each recompute mode, and a split backward keeping a recomputed
// micro-batch's activations until its weight gradients.
#include "pipeline/activation_memory.h"

#include <gtest/gtest.h>

#include "support/errors.h"

namespace pipetrain::testing::activation_memory_test {
namespace {

// Whole 10 bytes, boundary 2, workspace 1, on every stage.
std::vector<StageActivations> uniform(int64_t stages) {
  return std::vector<StageActivations>(stages, StageActivations{10, 2, 1});
}

TEST(ActivationMemory, GPipeHoldsEveryMicroBatchUnlessRecomputed) {
  const auto schedule = gpipe_schedule(2, 4);
  // Never: four whole micro-batches, then the first backward's workspace.
  EXPECT_EQ(peak_activation_bytes(schedule, uniform(2), 0), (std::vector<int64_t>{41, 41}));
  // Always: four boundaries, one micro-batch rebuilt at a time, plus workspace.
  EXPECT_EQ(peak_activation_bytes(schedule, uniform(2), 4), (std::vector<int64_t>{19, 19}));
  // Except the last: three boundaries and the last whole (6 + 10), then its backward (+1); the
  // next backward rebuilds one (6 + 10 + 1).
  EXPECT_EQ(peak_activation_bytes(schedule, uniform(2), 3), (std::vector<int64_t>{17, 17}));
}

TEST(ActivationMemory, OneFOneBHoldsAsManyMicroBatchesAsStagesAhead) {
  const auto schedule = one_f_one_b_schedule(3, 6);
  // Stage s holds 3 - s micro-batches whole.
  EXPECT_EQ(peak_activation_bytes(schedule, uniform(3), 0), (std::vector<int64_t>{31, 21, 11}));
}

TEST(ActivationMemory, ASplitBackwardKeepsARebuiltMicroBatchUntilItsWeightGradients) {
  // ZB-H1 on 2 stages: stage 1 runs F0 I0 F1 I1 W0 F2 I2 W1 ..., so at I1 two rebuilt micro-batches
  // wait for their W's (2 x (2 + 10), plus the workspace), where 1F1B's B frees its micro-batch at
  // once (F0 B0 F1 B1 ...: 2 + 10 + 1).
  const auto schedule = zbh1_schedule(2, 4);
  const auto split = peak_activation_bytes(schedule, uniform(2), 4);
  const auto whole = peak_activation_bytes(one_f_one_b_schedule(2, 4), uniform(2), 4);
  EXPECT_EQ(whole[1], 13);
  EXPECT_EQ(split[1], 25);
  // Nothing recomputed: I and W free what B frees, later.
  EXPECT_GE(peak_activation_bytes(schedule, uniform(2), 0)[0],
            peak_activation_bytes(one_f_one_b_schedule(2, 4), uniform(2), 0)[0]);
}

TEST(ActivationMemory, CostsMustMatchTheStages) {
  const auto message = error_of<std::invalid_argument>(
      [] { peak_activation_bytes(gpipe_schedule(2, 2), uniform(3), 0); });
  EXPECT_NE(message.find("the schedule has 2 stages, the costs 3"), std::string::npos) << message;
}

}  // namespace
}  // namespace pipetrain::testing::activation_memory_test
