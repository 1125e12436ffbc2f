// The lowered plan: every transfer between ranks appears once, as a send on one side and a receive
// on the other, right after the action that makes the tensors and right before the one that takes
// them; stages of one rank hand over without either; joined weight gradients go after the last
// backward.
#include "pipetrain/plan.h"

#include <gtest/gtest.h>

#include <map>
#include <tuple>

namespace pipetrain {
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
}  // namespace pipetrain
