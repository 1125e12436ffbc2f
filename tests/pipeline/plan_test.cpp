// The lowered plan: every transfer between ranks appears once, as a send on one side and a receive
// on the other, right after the action that makes the tensors and right before the one that takes
// them; stages of one rank hand over without either; joined weight gradients go after the last
// backward.
#include "pipeline/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

namespace pipetrain::plan_test {
namespace {

using Kind = PlannedAction::Kind;

TEST(Plan, TwoStagesReceiveBeforeAndSendAfter) {
  const Plan plan = lower(one_f_one_b_schedule(2, 2));
  EXPECT_EQ(format_plan(plan[0]),
            "0F0\nsend 0F0 to 1\n0F1\nsend 0F1 to 1\nrecv 0B0 from 1\n0B0\nrecv 0B1 from 1\n0B1\n");
  EXPECT_EQ(format_plan(plan[1]),
            "recv 1F0 from 0\n1F0\n1B0\nsend 1B0 to 0\nrecv 1F1 from 0\n1F1\n1B1\nsend 1B1 to 0\n");
}

TEST(Plan, WeightGradientsTakeAndGiveNothing) {
  const Plan plan = lower(zbh1_schedule(2, 1));
  EXPECT_EQ(format_plan(plan[1]), "recv 1F0 from 0\n1F0\n1I0\nsend 1I0 to 0\n1W0\n");
}

TEST(Plan, StagesOfOneRankHandOverWithoutTransfers) {
  // zbv: rank 0 runs stages 0 and 3, rank 1 stages 1 and 2; 1 -> 2 is a hand-over on rank 1.
  const Plan plan = lower(zbv_schedule(2, 3));
  for (const PlannedAction& p : plan[1]) {
    if (p.kind == Kind::kCompute) continue;
    const int64_t stage = p.action.stage;
    const bool to_or_from_rank_0 = p.gradients() == (p.kind == Kind::kReceive)
                                       ? stage == 2   // gradients from 3, activations to 3
                                       : stage == 1;  // activations from 0, gradients to 0
    EXPECT_TRUE(to_or_from_rank_0) << format_plan(plan[1]);
    EXPECT_EQ(p.peer, 0);
  }
}

// Every built schedule: each cross-rank transfer has its send and its receive, in the order the
// two ranks run them, and the compute actions are the schedule's own.
TEST(Plan, EverySendHasItsReceiveInOrder) {
  for (const std::string name : schedule_names()) {
    for (int64_t ranks = 1; ranks <= 4; ++ranks) {
      const int64_t v = name == "interleaved1f1b" || name == "zbv" ? 2 : 1;
      const Schedule schedule = make_schedule(name, ranks, 4, v);
      const Plan plan = lower(schedule);
      ASSERT_EQ(plan.size(), schedule.size());
      // Per (from, to, gradients): the (stage made at, micro-batch) sequence each side sees.
      std::map<std::tuple<int64_t, int64_t, bool>, std::vector<std::pair<int64_t, int64_t>>> sent,
          received;
      for (size_t r = 0; r < plan.size(); ++r) {
        size_t computes = 0;
        for (const PlannedAction& p : plan[r]) {
          const int64_t rank = static_cast<int64_t>(r);
          const Action& a = p.action;
          if (p.kind == Kind::kCompute) {
            Action expected = schedule[r][computes++];
            if (expected.stage < 0) expected.stage = rank;
            EXPECT_EQ(a, expected);
          } else if (p.kind == Kind::kSend) {
            sent[{rank, p.peer, p.gradients()}].push_back({a.stage, a.microbatch});
          } else if (p.kind == Kind::kReceive) {
            received[{p.peer, rank, p.gradients()}].push_back(
                {p.gradients() ? a.stage + 1 : a.stage - 1, a.microbatch});
          }
        }
        EXPECT_EQ(computes, schedule[r].size());
      }
      EXPECT_EQ(sent, received) << name << " over " << ranks << " ranks";
      EXPECT_NO_THROW(check_transfer_order(schedule)) << name;
    }
  }
}

TEST(Plan, JoinedWeightGradientsFollowTheLastBackwardAndItsSend) {
  std::vector<PlannedAction> rank1 = lower(gpipe_schedule(3, 2))[1];
  EXPECT_TRUE(can_join_weight_gradients(rank1, 0));
  EXPECT_FALSE(can_join_weight_gradients(rank1, 1));  // a recomputed micro-batch
  join_weight_gradients(rank1);
  EXPECT_EQ(format_plan(rank1),
            "recv 1F0 from 0\n1F0\nsend 1F0 to 2\nrecv 1F1 from 0\n1F1\nsend 1F1 to 2\n"
            "recv 1B1 from 2\n1B1\nsend 1B1 to 0\nrecv 1B0 from 2\n1B0\nsend 1B0 to 0\nwgrad 1*\n");
  // A forward after a backward (1F1B), or a schedule's own W's: not joined.
  EXPECT_FALSE(can_join_weight_gradients(lower(one_f_one_b_schedule(2, 2))[1], 0));
  EXPECT_FALSE(can_join_weight_gradients(lower(zbh1_schedule(2, 1))[1], 0));
  EXPECT_TRUE(can_join_weight_gradients(lower(one_f_one_b_schedule(2, 1))[1], 0));
}

TEST(Plan, DeferredWeightGradientsFollowEachBackwardsSend) {
  std::vector<PlannedAction> rank1 = lower(one_f_one_b_schedule(3, 2))[1];
  defer_weight_gradients(rank1);
  EXPECT_EQ(format_plan(rank1),
            "recv 1F0 from 0\n1F0\nsend 1F0 to 2\nrecv 1F1 from 0\n1F1\nsend 1F1 to 2\n"
            "recv 1B0 from 2\n1B0\nsend 1B0 to 0\nwgrad 1B0\n"
            "recv 1B1 from 2\n1B1\nsend 1B1 to 0\nwgrad 1B1\n");
  // The last stage's B takes nothing in; a split backward's weight gradients are its W.
  std::vector<PlannedAction> last = lower(one_f_one_b_schedule(2, 1))[1];
  defer_weight_gradients(last);
  EXPECT_EQ(format_plan(last), "recv 1F0 from 0\n1F0\n1B0\nsend 1B0 to 0\nwgrad 1B0\n");
  std::vector<PlannedAction> split = lower(zbh1_schedule(2, 1))[1];
  defer_weight_gradients(split);
  EXPECT_EQ(split, lower(zbh1_schedule(2, 1))[1]);
}

}  // namespace
}  // namespace pipetrain::plan_test

namespace pipetrain::plan_test {
namespace {

// Costs of every kind, unequal per stage, and a transfer: nothing lines up by accident.
ActionCosts mixed_costs(int64_t stages) {
  ActionCosts costs;
  for (int64_t s = 0; s < stages; ++s) {
    costs.forward.push_back(1.0 + 0.1 * static_cast<double>(s));
    costs.backward.push_back(2.0 + 0.3 * static_cast<double>(s % 2));
    costs.weight.push_back(0.7);
  }
  costs.transfer = 0.15;
  return costs;
}

// The plan a schedule lowers to, simulated action by action, takes the step the schedule's own
// simulation gives: sends and receives are where the dependencies were (to 1e-9).
TEST(PlanSimulation, ALoweredPlanTakesItsSchedulesStep) {
  int compared = 0;
  for (const std::string& name : schedule_names()) {
    const int64_t v = name == "interleaved1f1b" || name == "zbv" ? 2 : 1;
    for (int64_t ranks = 1; ranks <= 4; ++ranks) {
      for (const int64_t chunks : {2, 4, 8}) {
        Schedule schedule;
        try {
          schedule = make_schedule(name, ranks, chunks, v);
        } catch (const std::invalid_argument&) {
          continue;  // a shape this schedule refuses
        }
        const ActionCosts costs = mixed_costs(ranks * v);
        EXPECT_NEAR(simulate_plan(lower(schedule), costs).step_time,
                    simulate(schedule, costs).step_time, 1e-9)
            << name << ", " << ranks << " ranks, " << chunks << " chunks";
        ++compared;
      }
    }
  }
  EXPECT_GE(compared, 60);  // 6 schedules x 4 rank counts x 3 chunk counts, but the refused
}

// With fused Linear layers the ranks run their weight gradients apart from their backwards: the
// simulation of that plan counts them where they run. Two GPipe stages, no recompute: both join
// them after their last backward, so the first stage gets its last gradients W earlier and the
// step ends sooner than the plain schedule's (same total work per rank).
TEST(PlanSimulation, CountsWeightGradientsWhereThePlanPutsThem) {
  const Schedule schedule = gpipe_schedule(2, 4);
  const ActionCosts costs = mixed_costs(2);
  const Plan plan = executed_plan(schedule, true, 0);
  for (const auto& rank_actions : plan) {
    EXPECT_EQ(std::count_if(
                  rank_actions.begin(), rank_actions.end(),
                  [](const PlannedAction& p) { return p.kind == Kind::kJoinedWeightGradients; }),
              1)
        << format_plan(rank_actions);
  }
  const Simulation fused = simulate_plan(plan, costs), plain = simulate(schedule, costs);
  EXPECT_LT(fused.step_time, plain.step_time - 0.1);
  for (size_t r = 0; r < plan.size(); ++r) {
    EXPECT_NEAR(fused.busy_time[r], plain.busy_time[r], 1e-9) << "rank " << r;
  }
  // Recomputed micro-batches cannot join: each backward's weight gradients follow its send.
  const Plan deferred = executed_plan(schedule, true, 4);
  EXPECT_NE(format_plan(deferred[1]).find("wgrad 1B0"), std::string::npos)
      << format_plan(deferred[1]);
  EXPECT_EQ(format_plan(deferred[0]).find("wgrad"), std::string::npos)
      << "the first stage alone has no gradient to hurry:\n"
      << format_plan(deferred[0]);
  EXPECT_NO_THROW(simulate_plan(deferred, costs));
}

// The first stage alone puts its weight gradients off only to join several backwards': of one,
// they would only keep each layer's gradient and input alive until the backward ends.
TEST(Plan, TheFirstStageAloneDefersOnlyToJoin) {
  EXPECT_TRUE(defers_weight_gradients(lower(gpipe_schedule(1, 2)), 0, 0));
  EXPECT_FALSE(defers_weight_gradients(lower(gpipe_schedule(1, 1)), 0, 0));
  EXPECT_FALSE(defers_weight_gradients(lower(gpipe_schedule(1, 2)), 0, 2));  // recomputed
  EXPECT_EQ(format_plan(executed_plan(gpipe_schedule(1, 1), true, 0)[0]), "0F0\n0B0\n");
  // A later stage's one backward still puts them after its send.
  EXPECT_TRUE(defers_weight_gradients(lower(gpipe_schedule(2, 1)), 1, 0));
}

// Each send and receive takes its rank `message` (the host's own part of a transfer), on top of
// the transfer's travel. Two GPipe stages, one micro-batch, F 1, B 2, transfer 0.1, message 0.5:
// rank 1 takes the activation at 1.1 and is busy until 1.6, runs F and B until 4.6 and sends;
// rank 0 takes the gradient at 4.7, busy until 5.2, and its B ends the step at 7.2 (6.2 free).
TEST(PlanSimulation, EveryTransferTakesItsRankTheMessageCost) {
  const Plan plan = lower(gpipe_schedule(2, 1));
  ActionCosts costs = ActionCosts::uniform(2, 1.0, 2.0);
  costs.transfer = 0.1;
  EXPECT_NEAR(simulate_plan(plan, costs).step_time, 6.2, 1e-9);
  costs.message = 0.5;
  const Simulation sim = simulate_plan(plan, costs);
  EXPECT_NEAR(sim.step_time, 7.2, 1e-9);
  // Each rank sends once and receives once.
  EXPECT_NEAR(sim.busy_time[0], 1.0 + 2.0 + 2 * 0.5, 1e-9);
  EXPECT_NEAR(sim.busy_time[1], 1.0 + 2.0 + 2 * 0.5, 1e-9);
  costs.message = -1;
  EXPECT_THROW(simulate(gpipe_schedule(2, 1), costs), std::invalid_argument);
}

TEST(PlanSimulation, AReceiveWhoseSendNeverComesIsNamed) {
  Plan plan = lower(one_f_one_b_schedule(2, 2));
  // Rank 1 forgets to send 1B1's gradients: rank 0 waits for them forever.
  auto& rank1 = plan[1];
  rank1.erase(std::remove_if(rank1.begin(), rank1.end(),
                             [](const PlannedAction& p) {
                               return p.kind == Kind::kSend && p.action.microbatch == 1;
                             }),
              rank1.end());
  try {
    simulate_plan(plan, ActionCosts::uniform(2));
    FAIL() << "expected the plan to be refused";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 waits forever at: recv 0B1 from 1"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pipetrain::plan_test
