// The planner on layer costs made up for the test: the balance that makes the slowest stage
// fastest, a recompute mode chosen where memory asks for one, a plan's memory as counted by hand,
// transfers and replicas' all-reduce by hand, and an honest answer when nothing fits.
#include "train/training_plan.h"

#include <gtest/gtest.h>

#include <algorithm>

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
  options.stages = 2;
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
  // The limit it needs: the largest rank's 800 plus its 56 bytes of activations and 10% of them.
  PlannerOptions margin = two_ranks();
  margin.memory_margin = 0.1;
  EXPECT_EQ(bytes_needed(*gpipe, margin), 800 + 62);
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
  EXPECT_NE(message.find("no plan fits 0.0 MiB per device (--device-memory, --max-memory"),
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
  EXPECT_NE(message.find("(" + named + ";"), std::string::npos) << message;
}

TEST(TrainingPlan, PlansLeaveTheMarginFree) {
  const std::map<int64_t, LayerProfile> profiles{{2, profile_of({1, 1, 1, 1}, 10, 2)}};
  const auto fastest = choose_plan(weigh_plans(profiles, two_ranks()), two_ranks());
  // A limit the fastest plan's prediction meets exactly, but not with the margin on its
  // activations.
  PlannerOptions options = two_ranks(fastest.max_peak_bytes());
  options.memory_margin = 0.1;
  EXPECT_FALSE(fits(fastest, options));
  const auto plans = weigh_plans(profiles, options);
  for (const auto& plan : plans) {
    if (fits(plan, options)) {
      EXPECT_LE(bytes_needed(choose_plan(plans, options), options), options.max_memory);
      return;
    }
  }
  EXPECT_NE(error_of<std::invalid_argument>([&] {
              choose_plan(plans, options);
            }).find("as a margin for what the prediction misses"),
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

TEST(TrainingPlan, ReplicasAllReduceTheirGradientsAndZeroSharesTheOptimizerState) {
  // One micro-batch; each stage 2 layers of 100 parameter bytes; links of 100 bytes/s.
  const std::map<int64_t, LayerProfile> profiles{{1, profile_of({1, 1, 1, 1}, 10, 4)}};
  PlannerOptions one = two_ranks();
  one.link_bytes_per_second = one.network_bytes_per_second = 100;
  one.schedules = {"gpipe"};
  const auto alone = weigh_plans(profiles, one);
  PlannerOptions two = one;
  two.replicas = 2;
  two.ranks_per_node = 4;  // all four ranks on one node
  const auto plans = weigh_plans(profiles, two);
  auto find = [&](int64_t zero_stage) {
    const auto it = std::find_if(plans.begin(), plans.end(), [&](const TrainingPlan& p) {
      return p.zero_stage == zero_stage && p.checkpoint == CheckpointMode::kNever;
    });
    EXPECT_NE(it, plans.end());
    return *it;
  };
  const TrainingPlan plain = find(0), zero = find(1);
  ASSERT_EQ(plain.balance, (std::vector<int64_t>{2, 2}));
  ASSERT_EQ(alone.front().balance, plain.balance);
  // The ring all-reduce moves 2 (R-1)/R x 200 gradient bytes: 2 s after the pipeline.
  EXPECT_NEAR(plain.step_seconds - alone.front().step_seconds, 2.0, 1e-9);
  EXPECT_DOUBLE_EQ(plain.pipeline_seconds, alone.front().pipeline_seconds);
  EXPECT_DOUBLE_EQ(plain.seconds_per_batch(), plain.step_seconds / 2);
  // ZeRO 1 then exchanges (R-1)/R of the 200 parameter bytes: 1 s more, for half the state.
  EXPECT_NEAR(zero.step_seconds - plain.step_seconds, 1.0, 1e-9);
  EXPECT_EQ(plain.static_bytes, (std::vector<int64_t>{800, 800}));
  EXPECT_EQ(zero.static_bytes, (std::vector<int64_t>{600, 600}));
  EXPECT_NE(zero.describe().find("replicas 2 zero_stage 1"), std::string::npos) << zero.describe();
  // A limit between the two: ZeRO's plan is the one that fits.
  two.max_memory = plain.max_peak_bytes() - 1;
  EXPECT_EQ(choose_plan(weigh_plans(profiles, two), two).zero_stage, 1);
  // Two nodes of two ranks: each stage's replicas (ranks s and 2 + s) meet over the network.
  two.ranks_per_node = 2;
  two.network_bytes_per_second = 50;
  two.max_memory = 0;
  const auto spread = weigh_plans(profiles, two);
  const auto spread_plain = std::find_if(spread.begin(), spread.end(), [](const auto& p) {
    return p.zero_stage == 0 && p.checkpoint == CheckpointMode::kNever;
  });
  EXPECT_NEAR(spread_plain->step_seconds - alone.front().step_seconds, 4.0, 1e-9);
}

// CPU ranks sharing too few cores take turns: the forwards and backwards last at least the ranks'
// compute x threads / cores. One micro-batch of 4 layers (1 ms forward, 2 ms backward each) on
// 2 stages: the schedule alone takes 12 ms (nothing overlaps); 4 ranks (2 replicas) of 1 thread
// on 2 cores compute 24 ms between them, so 12 ms at best; on 1 core, 24 ms.
TEST(TrainingPlan, RanksSharingTooFewCoresTakeTurns) {
  const std::map<int64_t, LayerProfile> profiles{{1, profile_of({1, 1, 1, 1}, 10, 4)}};
  PlannerOptions options = two_ranks();
  options.schedules = {"gpipe"};
  options.replicas = 2;
  const auto never = [](const std::vector<TrainingPlan>& plans) {
    return *std::find_if(plans.begin(), plans.end(), [](const TrainingPlan& p) {
      return p.zero_stage == 0 && p.checkpoint == CheckpointMode::kNever;
    });
  };
  const TrainingPlan own_devices = never(weigh_plans(profiles, options));
  EXPECT_NEAR(own_devices.pipeline_seconds, 12e-3, 1e-12);
  options.cores_per_node = 2;
  const TrainingPlan two_cores = never(weigh_plans(profiles, options));
  EXPECT_NEAR(two_cores.pipeline_seconds, 12e-3, 1e-12);
  EXPECT_DOUBLE_EQ(two_cores.step_seconds, own_devices.step_seconds);
  options.cores_per_node = 1;
  const TrainingPlan one_core = never(weigh_plans(profiles, options));
  EXPECT_NEAR(one_core.pipeline_seconds, 24e-3, 1e-12);
  EXPECT_NEAR(one_core.step_seconds - own_devices.step_seconds, 12e-3, 1e-12);
  // Two threads per rank on 2 cores: as one thread on one.
  options.cores_per_node = 2;
  options.threads_per_rank = 2;
  EXPECT_NEAR(never(weigh_plans(profiles, options)).pipeline_seconds, 24e-3, 1e-12);
  // Two nodes of 2 ranks, a core each: each node computes half of it.
  options.threads_per_rank = 1;
  options.cores_per_node = 1;
  options.ranks_per_node = 2;
  EXPECT_NEAR(never(weigh_plans(profiles, options)).pipeline_seconds, 12e-3, 1e-12);
}

TEST(TrainingPlan, InterleavedAndVSchedulesRunTwoStagesPerRank) {
  // 4 layers of 1 ms forward, 2 ms backward over 2 ranks, 2 micro-batches: one-stage schedules
  // take (chunks + ranks - 1) x 6 ms = 18 ms; two stages per rank take chunks x 2 x 3 + 3 = 15.
  const std::map<int64_t, LayerProfile> profiles{{2, profile_of({1, 1, 1, 1}, 10, 2)}};
  const auto plans = weigh_plans(profiles, two_ranks());
  auto find = [&](const std::string& schedule) {
    const auto it = std::find_if(plans.begin(), plans.end(), [&](const TrainingPlan& p) {
      return p.schedule == schedule && p.checkpoint == CheckpointMode::kNever;
    });
    EXPECT_NE(it, plans.end()) << schedule;
    return *it;
  };
  const TrainingPlan one = find("1f1b"), interleaved = find("interleaved1f1b"), v = find("zbv");
  EXPECT_NEAR(one.pipeline_seconds, 18e-3, 1e-12);
  EXPECT_NEAR(interleaved.pipeline_seconds, 15e-3, 1e-12);
  EXPECT_EQ(interleaved.virtual_stages, 2);
  EXPECT_EQ(interleaved.balance, (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_NE(interleaved.describe().find("schedule interleaved1f1b virtual_stages 2"),
            std::string::npos);
  // Each rank holds two layers' weights, gradients and AdamW state, whichever its stages.
  EXPECT_EQ(interleaved.static_bytes, (std::vector<int64_t>{800, 800}));
  EXPECT_EQ(v.static_bytes, (std::vector<int64_t>{800, 800}));
  ASSERT_EQ(v.peak_bytes.size(), 2u);
  // zbv puts stages 0 and 3 on rank 0: the table says so.
  EXPECT_NE(plan_table(v).find("    3     0     3-3"), std::string::npos) << plan_table(v);
  // The plan file keeps the stages per rank.
  const auto back = plan_from_json(plan_to_json(interleaved), "test");
  EXPECT_EQ(back.virtual_stages, 2);
  EXPECT_EQ(back.balance, interleaved.balance);
}

TEST(TrainingPlan, ParametersTwoLayersShareAreHeldOnceWhereOneRankHoldsBoth) {
  // The last layer's 100 parameter bytes are the first's (a head tied to the embedding).
  LayerProfile tied = profile_of({1, 1, 1, 1}, 10, 2);
  tied.layers[3].shared_parameter_bytes = {{0, 100}};
  const std::map<int64_t, LayerProfile> profiles{{2, tied}};
  PlannerOptions one = two_ranks();
  one.stages = 1;
  // One rank: 300 bytes of parameters, x4 with gradients and AdamW's state.
  EXPECT_EQ(weigh_plans(profiles, one).front().static_bytes, (std::vector<int64_t>{1200}));
  const auto plans = weigh_plans(profiles, two_ranks());
  for (const auto& plan : plans) {
    SCOPED_TRACE(plan.describe());
    if (plan.schedule == "zbv") {  // rank 0 holds the first and the last layer
      EXPECT_EQ(plan.static_bytes, (std::vector<int64_t>{400, 800}));
    } else if (plan.schedule != "interleaved1f1b") {  // each of two ranks its own copy
      EXPECT_EQ(plan.static_bytes, (std::vector<int64_t>{800, 800}));
    }
  }
}

TEST(TrainingPlan, FewerLayersThanRanksIsRefused) {
  const auto message = error_of<std::invalid_argument>([] {
    weigh_plans({{1, profile_of({1}, 10, 4)}}, two_ranks());
  });
  EXPECT_NE(message.find("a plan over 2 stages needs at least as many layers; the model has 1"),
            std::string::npos)
      << message;
}

}  // namespace
}  // namespace pipetrain::testing::training_plan_test
