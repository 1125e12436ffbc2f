// The planner on layer costs made up for the test: the balance that makes the slowest stage
// fastest, a recompute mode chosen where memory asks for one, a plan's memory as counted by hand,
// and an honest answer when nothing fits.
#include "train/training_plan.h"

#include <gtest/gtest.h>

#include "support/errors.h"

namespace pipetrain::testing::training_plan_test {
namespace {

// `forward_ms[i]` per layer, the backward twice as long (half of it the input gradient); each
// layer 100 bytes of parameters, `activation` bytes held, 4 bytes passed on.
LayerProfile profile_of(const std::vector<double>& forward_ms, int64_t activation, int64_t rows) {
  LayerProfile profile;
  profile.rows = rows;
  profile.input_bytes = 4;
  for (const double ms : forward_ms) {
    LayerCost cost;
    cost.forward_seconds = ms * 1e-3;
    cost.backward_seconds = 2 * ms * 1e-3;
    cost.input_backward_seconds = ms * 1e-3;
    cost.weight_backward_seconds = ms * 1e-3;
    cost.activation_bytes = activation;
    cost.output_bytes = 4;
    cost.parameter_bytes = 100;
    profile.layers.push_back(cost);
  }
  return profile;
}

PlannerOptions two_ranks(int64_t max_memory = 0) {
  PlannerOptions options;
  options.ranks = 2;
  options.max_memory = max_memory;
  options.memory_margin = 0;  // the limits below are what plans may use
  return options;
}

TEST(TrainingPlan, BalancesUnevenLayersByTime) {
  // One layer as slow as the other three together: alone on a stage of its own.
  const auto plans = weigh_plans({{2, profile_of({1, 1, 1, 3}, 10, 2)}}, two_ranks());
  const auto plan = choose_plan(plans, two_ranks());
  EXPECT_EQ(plan.balance, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(plan.chunks, 2);
}

TEST(TrainingPlan, MemoryIsCountedAsByHand) {
  const auto plans = weigh_plans({{2, profile_of({1, 1, 1, 1}, 10, 2)}}, two_ranks());
  const auto gpipe = std::find_if(plans.begin(), plans.end(), [](const TrainingPlan& p) {
    return p.schedule == "gpipe" && p.checkpoint == CheckpointMode::kNever;
  });
  ASSERT_NE(gpipe, plans.end());
  ASSERT_EQ(gpipe->balance, (std::vector<int64_t>{2, 2}));
  // Static: 2 layers x 100 bytes x (weights, gradients, AdamW's two moments) = 800. GPipe holds
  // both micro-batches whole: stage 0 its input (4) and two layers' 10 each = 24, twice; the last
  // stage also the loss's gradient of its output (4): 28, twice.
  EXPECT_EQ(gpipe->peak_bytes, (std::vector<int64_t>{800 + 48, 800 + 56}));
  EXPECT_EQ(gpipe->static_bytes, (std::vector<int64_t>{800, 800}));
}

TEST(TrainingPlan, ATightLimitIsMetByRecomputingAndNeverExceeded) {
  // Activations dominate: 1000 bytes per layer and micro-batch.
  const std::map<int64_t, LayerProfile> profiles{{4, profile_of({1, 1, 1, 1}, 1000, 1)}};
  const auto all = weigh_plans(profiles, two_ranks());
  const auto free = choose_plan(all, two_ranks());
  EXPECT_EQ(free.checkpoint, CheckpointMode::kNever);  // recomputing only costs time
  // Below what any plan that keeps every activation needs.
  int64_t limit = free.max_peak_bytes();
  for (const auto& plan : all) {
    if (plan.checkpoint == CheckpointMode::kNever)
      limit = std::min(limit, plan.max_peak_bytes() - 1);
  }
  const auto plans = weigh_plans(profiles, two_ranks(limit));
  const auto tight = choose_plan(plans, two_ranks(limit));
  EXPECT_LE(tight.max_peak_bytes(), limit);
  EXPECT_NE(tight.checkpoint, CheckpointMode::kNever) << tight.describe();
  EXPECT_GT(tight.step_seconds, free.step_seconds);
  for (const auto& plan : plans) {  // the fastest of those that fit
    if (plan.max_peak_bytes() <= limit) EXPECT_GE(plan.step_seconds, tight.step_seconds);
  }
}

TEST(TrainingPlan, NothingFitsNamesTheSmallestPlan) {
  const std::map<int64_t, LayerProfile> profiles{{2, profile_of({1, 1, 1, 1}, 10, 2)}};
  const auto plans = weigh_plans(profiles, two_ranks(100));
  const auto message = error_of<std::invalid_argument>([&] { choose_plan(plans, two_ranks(100)); });
  EXPECT_NE(message.find("no plan fits max_memory (--max-memory) 0.0 MiB per device"),
            std::string::npos)
      << message;
  // The plan named is the one needing least.
  int64_t smallest = plans.front().max_peak_bytes();
  std::string named;
  for (const auto& plan : plans) {
    if (plan.max_peak_bytes() < smallest) smallest = plan.max_peak_bytes();
  }
  for (const auto& plan : plans) {
    if (plan.max_peak_bytes() == smallest && named.empty()) named = plan.describe();
  }
  EXPECT_NE(message.find("(" + named + ")"), std::string::npos) << message;
}

TEST(TrainingPlan, PlansLeaveTheMarginFree) {
  const std::map<int64_t, LayerProfile> profiles{{2, profile_of({1, 1, 1, 1}, 10, 2)}};
  const auto fastest = choose_plan(weigh_plans(profiles, two_ranks()), two_ranks());
  // A limit the fastest plan meets exactly, but not with 10% of it kept free.
  PlannerOptions options = two_ranks(fastest.max_peak_bytes());
  options.memory_margin = 0.1;
  EXPECT_EQ(usable_bytes(options), static_cast<int64_t>(0.9 * fastest.max_peak_bytes()));
  const auto plans = weigh_plans(profiles, options);
  for (const auto& plan : plans) {
    if (plan.max_peak_bytes() <= usable_bytes(options)) {
      EXPECT_LE(choose_plan(plans, options).max_peak_bytes(), usable_bytes(options));
      return;
    }
  }
  EXPECT_NE(error_of<std::invalid_argument>([&] {
              choose_plan(plans, options);
            }).find("(the rest is its margin for what it does not predict)"),
            std::string::npos);
}

TEST(TrainingPlan, TransfersTakeTheirBytesOverTheLinkBetweenNodes) {
  // 4 bytes cross each boundary: at 4 bytes/s a transfer takes 1 s, far above the 1 ms layers.
  const std::map<int64_t, LayerProfile> profiles{{1, profile_of({1, 1, 1, 1}, 10, 4)}};
  const auto free = choose_plan(weigh_plans(profiles, two_ranks()), two_ranks());
  PlannerOptions across = two_ranks();
  across.ranks_per_node = 1;  // each rank a node of its own
  across.network_bytes_per_second = 4;
  const auto slow = choose_plan(weigh_plans(profiles, across), across);
  // One micro-batch (chunks 1): its activations forward, its gradients back, 1 s each.
  EXPECT_NEAR(slow.step_seconds - free.step_seconds, 2.0, 1e-9);
  // Both ranks on one node: the network is not crossed, and the link is free.
  across.ranks_per_node = 2;
  EXPECT_DOUBLE_EQ(choose_plan(weigh_plans(profiles, across), across).step_seconds,
                   free.step_seconds);
}

TEST(TrainingPlan, FewerLayersThanRanksIsRefused) {
  const auto message = error_of<std::invalid_argument>([] {
    weigh_plans({{1, profile_of({1}, 10, 4)}}, two_ranks());
  });
  EXPECT_NE(message.find("a plan over 2 ranks needs at least as many layers; the model has 1"),
            std::string::npos)
      << message;
}

}  // namespace
}  // namespace pipetrain::testing::training_plan_test
