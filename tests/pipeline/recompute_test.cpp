#include "pipeline/recompute.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace pipetrain::recompute_test {
namespace {

TEST(CheckpointMode, ParsesTheThreeModes) {
  EXPECT_EQ(parse_checkpoint_mode("always"), CheckpointMode::kAlways);
  EXPECT_EQ(parse_checkpoint_mode("except_last"), CheckpointMode::kExceptLast);
  EXPECT_EQ(parse_checkpoint_mode("never"), CheckpointMode::kNever);
  EXPECT_THROW(parse_checkpoint_mode("Always"), std::invalid_argument);
}

TEST(CheckpointMode, ExceptLastKeepsOnlyTheLastMicrobatch) {
  EXPECT_EQ(recompute_below(CheckpointMode::kAlways, 4), 4);
  EXPECT_EQ(recompute_below(CheckpointMode::kExceptLast, 4), 3);
  EXPECT_EQ(recompute_below(CheckpointMode::kExceptLast, 1), 0);
  EXPECT_EQ(recompute_below(CheckpointMode::kNever, 4), 0);
}

TEST(RngState, ReplayDrawsTheSameNumbersAndLeavesTheGeneratorAlone) {
  torch::manual_seed(5);
  const auto state = RngState::capture();
  const auto first = torch::rand({4});
  const auto next_expected = [] {
    torch::manual_seed(5);
    torch::rand({4});
    return torch::rand({4});
  }();
  torch::manual_seed(5);
  torch::rand({4});
  const auto replayed = state.replay([] { return torch::rand({4}); });
  EXPECT_TRUE(torch::equal(replayed, first));
  EXPECT_TRUE(torch::equal(torch::rand({4}), next_expected));
}

}  // namespace
}  // namespace pipetrain::recompute_test
