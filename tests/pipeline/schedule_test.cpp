// Pins down the exact action orders of GPipe, 1F1B and ZB-H1 and the behaviour of the cost-model
// replay. The runtime executes these lists verbatim on every rank, so an order change here would
// silently change memory use or deadlock a real run; these tests make such a change loud.
#include "pipetrain/schedule.h"

#include "support/errors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace pipetrain::schedule_test {
namespace {

using testing::error_of;

// "0F0 0F1 0B0 ..." so expected orders read like the papers' diagrams.
std::string stage_order(const Schedule& schedule, int64_t stage) {
  std::string out;
  for (const Action& a : schedule[stage]) {
    if (!out.empty()) out += ' ';
    out += action_name(stage, a);
  }
  return out;
}

// Inverse of stage_order for hand-made schedules: "F0 B0 F1" for one stage.
std::vector<Action> parse(const std::string& text) {
  std::vector<Action> actions;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ' ') {
      ++i;
      continue;
    }
    const Phase phase = text[i] == 'F'   ? Phase::kForward
                        : text[i] == 'B' ? Phase::kBackward
                        : text[i] == 'I' ? Phase::kInputBackward
                                         : Phase::kWeightBackward;
    size_t end = text.find(' ', i);
    if (end == std::string::npos) end = text.size();
    actions.push_back({phase, std::stoll(text.substr(i + 1, end - i - 1))});
    i = end;
  }
  return actions;
}

// Maximum over the step of (forwards run - backwards finished) on one stage, a split backward
// finishing at its W: how many micro-batches' activations it has to hold at once.
int64_t max_in_flight(const std::vector<Action>& actions) {
  int64_t live = 0, peak = 0;
  for (const Action& a : actions) {
    if (a.phase == Phase::kInputBackward) continue;
    live += a.phase == Phase::kForward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

TEST(ScheduleTest, ActionNameAndEquality) {
  EXPECT_EQ(action_name(0, {Phase::kForward, 3}), "0F3");
  EXPECT_EQ(action_name(12, {Phase::kBackward, 10}), "12B10");
  EXPECT_EQ(action_name(1, {Phase::kInputBackward, 2}), "1I2");
  EXPECT_EQ(action_name(1, {Phase::kWeightBackward, 2}), "1W2");
  EXPECT_EQ((Action{Phase::kForward, 1}), (Action{Phase::kForward, 1}));
  EXPECT_NE((Action{Phase::kForward, 1}), (Action{Phase::kBackward, 1}));
  EXPECT_NE((Action{Phase::kForward, 1}), (Action{Phase::kForward, 2}));
}

TEST(ScheduleTest, GPipeRunsAllForwardsThenBackwardsInReverse) {
  const Schedule s = gpipe_schedule(2, 4);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(stage_order(s, 0), "0F0 0F1 0F2 0F3 0B3 0B2 0B1 0B0");
  EXPECT_EQ(stage_order(s, 1), "1F0 1F1 1F2 1F3 1B3 1B2 1B1 1B0");
}

TEST(ScheduleTest, OneFOneBTwoStagesFourChunks) {
  const Schedule s = one_f_one_b_schedule(2, 4);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(stage_order(s, 0), "0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3");
  EXPECT_EQ(stage_order(s, 1), "1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3");
}

TEST(ScheduleTest, OneFOneBFourStagesEightChunks) {
  const Schedule s = one_f_one_b_schedule(4, 8);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(stage_order(s, 0), "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7");
  EXPECT_EQ(stage_order(s, 1), "1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1F6 1B4 1F7 1B5 1B6 1B7");
  EXPECT_EQ(stage_order(s, 2), "2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2F6 2B5 2F7 2B6 2B7");
  EXPECT_EQ(stage_order(s, 3), "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7");
}

TEST(ScheduleTest, OneFOneBWithFewerChunksThanStagesIsAllForwardsThenBackwards) {
  const Schedule s = one_f_one_b_schedule(4, 2);
  EXPECT_EQ(stage_order(s, 0), "0F0 0F1 0B0 0B1");
  EXPECT_EQ(stage_order(s, 2), "2F0 2F1 2B0 2B1");
  EXPECT_EQ(stage_order(s, 3), "3F0 3B0 3F1 3B1");
}

TEST(ScheduleTest, ZBH1DelaysEachStagesWeightGradientsByItsIndex) {
  const Schedule s = zbh1_schedule(2, 4);
  EXPECT_EQ(stage_order(s, 0), "0F0 0F1 0I0 0W0 0F2 0I1 0W1 0F3 0I2 0W2 0I3 0W3");
  EXPECT_EQ(stage_order(s, 1), "1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1F3 1I3 1W2 1W3");
  const Schedule four = zbh1_schedule(4, 6);
  EXPECT_EQ(stage_order(four, 3),
            "3F0 3I0 3F1 3I1 3F2 3I2 3F3 3I3 3W0 3F4 3I4 3W1 3F5 3I5 3W2 3W3 3W4 3W5");
}

// Zero Bubble Pipeline Parallelism (Qi et al., 2024), section 2.1, with B the whole backward:
// 1F1B's bubble is (p - 1)(F + B) per stage, ZB-H1's (p - 1)(F + B - 2W) where W <= F.
TEST(ScheduleTest, ZBH1BubbleMatchesThePublishedFormula) {
  struct Costs {
    double f, b, w;
  };
  for (const Costs c : {Costs{1, 2, 1}, Costs{1, 3, 1}, Costs{2, 3, 1}, Costs{2, 4, 2}}) {
    for (int64_t p = 2; p <= 4; ++p) {
      for (int64_t m : {4, 8, 16}) {
        SCOPED_TRACE("F=" + std::to_string(c.f) + " B=" + std::to_string(c.b) + " W=" +
                     std::to_string(c.w) + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        const ActionCosts costs = ActionCosts::uniform(p, c.f, c.b, c.w);
        const double work = static_cast<double>(m) * (c.f + c.b);
        const Simulation zb = simulate(zbh1_schedule(p, m), costs);
        EXPECT_DOUBLE_EQ(zb.step_time - work, double(p - 1) * (c.f + c.b - 2 * c.w));
        const Simulation f1b1 = simulate(one_f_one_b_schedule(p, m), costs);
        EXPECT_DOUBLE_EQ(f1b1.step_time - work, double(p - 1) * (c.f + c.b));
        for (int64_t s = 0; s < p; ++s) EXPECT_DOUBLE_EQ(zb.busy_time[s], work);
      }
    }
  }
}

TEST(ScheduleTest, ZBH1HoldsNoMoreActivationsThanOneFOneBsFirstStage) {
  for (int64_t p = 1; p <= 6; ++p) {
    for (int64_t m : {1, 2, 3, 4, 8, 16}) {
      const Schedule zb = zbh1_schedule(p, m);
      for (int64_t s = 0; s < p; ++s) {
        EXPECT_EQ(max_in_flight(zb[s]), std::min(p, m)) << "p=" << p << " m=" << m << " s=" << s;
      }
      EXPECT_NO_THROW(simulate(zb, ActionCosts::uniform(p, 1, 2, 1)));
    }
  }
}

// ZB-H2 keeps each stage busy from its first forward to its last action: with W as long as I (and
// no longer than F) its step is the least any schedule can take, the first forward's way to the
// last stage plus every stage's own work; where I and W differ it still never loses to ZB-H1.
TEST(ScheduleTest, ZBH2TakesTheLeastStepWhereWIsAsLongAsI) {
  struct Costs {
    double f, b, w;
  };
  for (int64_t p = 1; p <= 4; ++p) {
    for (int64_t m : {1, 2, 3, 4, 5, 8, 16}) {
      const Schedule zb2 = zbh2_schedule(p, m);
      EXPECT_NO_THROW(check_transfer_order(zb2));
      for (const Costs c : {Costs{1, 2, 1}, Costs{2, 2, 1}, Costs{3, 2, 1}, Costs{1, 1, 0.5},
                            Costs{1, 2, 0.5}, Costs{1, 1, 0.4}, Costs{1, 1, 0.6}, Costs{2, 3, 1}}) {
        SCOPED_TRACE("F=" + std::to_string(c.f) + " B=" + std::to_string(c.b) + " W=" +
                     std::to_string(c.w) + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        const ActionCosts costs = ActionCosts::uniform(p, c.f, c.b, c.w);
        const double step = simulate(zb2, costs).step_time;
        EXPECT_LE(step, simulate(zbh1_schedule(p, m), costs).step_time + 1e-9);
        if (2 * c.w == c.b && c.w <= c.f && m >= p) {
          EXPECT_DOUBLE_EQ(step, double(p - 1) * c.f + double(m) * (c.f + c.b));
        }
      }
      for (int64_t s = 0; s < p; ++s) {
        EXPECT_EQ(max_in_flight(zb2[s]), std::min(2 * p - 1, m)) << "p=" << p << " m=" << m;
      }
    }
  }
  EXPECT_EQ(stage_order(zbh2_schedule(2, 4), 0), "0F0 0F1 0F2 0I0 0W0 0I1 0F3 0I2 0W1 0W2 0I3 0W3");
}

TEST(ScheduleTest, ActivationsHeldCountsEachStageFromItsForwardToItsLastBackward) {
  for (const std::string name : {"gpipe", "1f1b", "zbh1", "zbh2"}) {
    const Schedule s = make_schedule(name, 3, 5);
    const std::vector<int64_t> held = activations_held(s);
    ASSERT_EQ(held.size(), 3u) << name;
    for (int64_t st = 0; st < 3; ++st) EXPECT_EQ(held[st], max_in_flight(s[st])) << name;
  }
  // Two stages on one rank: counted apart.
  EXPECT_EQ(activations_held(gpipe_schedule_placed({0, 0, 1}, 4)), (std::vector<int64_t>{4, 4, 4}));
  EXPECT_EQ(activations_held(one_f_one_b_schedule(3, 5)), (std::vector<int64_t>{3, 2, 1}));
}

TEST(ScheduleTest, SplitBackwardsAreCheckedLikeWholeOnes) {
  Schedule s(2);
  s[0] = parse("F0 F1 I0 W0 I1 W1");
  s[1] = parse("F0 I0 F1 B1 W0");
  EXPECT_NO_THROW(simulate(s, ActionCosts::uniform(2, 1, 2, 1)));
  EXPECT_NE(format_schedule(s).find("stage 1 .    1F0  1I0  1F1  1B1  1W0"), std::string::npos)
      << format_schedule(s);

  Schedule no_weight = s;
  no_weight[1] = parse("F0 I0 F1 B1");
  std::string msg = error_of([&] { simulate(no_weight, ActionCosts::uniform(2)); });
  EXPECT_NE(msg.find("stage 1 has 1I0 but no 1W0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("<-- ERROR HERE"), std::string::npos) << msg;

  Schedule both = s;
  both[1] = parse("F0 I0 B0 F1 B1 W0");
  msg = error_of([&] { simulate(both, ActionCosts::uniform(2)); });
  EXPECT_NE(msg.find("stage 1 runs both 1B0 and 1I0"), std::string::npos) << msg;

  Schedule early = s;
  early[1] = parse("F0 W0 I0 F1 B1");
  msg = error_of([&] { simulate(early, ActionCosts::uniform(2)); });
  EXPECT_NE(msg.find("stage 1 is stuck at 1W0, which waits for 1I0 (later in stage 1's own list)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("<-- ERROR HERE"), std::string::npos) << msg;

  EXPECT_THROW(ActionCosts::uniform(2, 1, 1, 2), std::invalid_argument);  // W is part of B
}

TEST(ScheduleTest, InterleavedOneFOneBLoopsEachMicroBatchThroughEveryRankTwice) {
  const Schedule s = interleaved_1f1b_schedule(2, 2, 4);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(stage_order(s, 0), "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3");
  EXPECT_EQ(stage_order(s, 1), "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3");
  const std::string grid = format_schedule(s);
  EXPECT_EQ(grid.rfind("rank 0 0F0", grid.find('\n') + 1), grid.find('\n') + 1) << grid;
}

// Narayanan et al. (2021), section 2.2: with v stages per rank, each 1/v of a rank's work, the
// bubble is (p - 1) / (v m) of the ideal step time.
TEST(ScheduleTest, InterleavedBubbleMatchesThePublishedFormula) {
  for (int64_t p = 2; p <= 4; ++p) {
    for (int64_t v : {1, 2, 3}) {
      for (int64_t m : {4, 8, 12, 16}) {
        if (m < p || m % std::max<int64_t>(1, m / p) != 0) continue;
        SCOPED_TRACE("p=" + std::to_string(p) + " v=" + std::to_string(v) +
                     " m=" + std::to_string(m));
        const Simulation sim =
            simulate(interleaved_1f1b_schedule(p, v, m), ActionCosts::uniform(p * v, 1, 2));
        const double ideal = 3.0 * v * m;
        EXPECT_NEAR((sim.step_time - ideal) / ideal, double(p - 1) / double(v * m), 1e-12);
      }
    }
  }
}

TEST(ScheduleTest, InterleavedRefusesChunksItsRoundsDoNotDivide) {
  const std::string msg = error_of([] { interleaved_1f1b_schedule(3, 2, 16); });
  EXPECT_NE(msg.find("chunks 16 over 3 ranks makes 5 rounds"), std::string::npos) << msg;
  EXPECT_THROW(interleaved_1f1b_schedule(3, 0, 6), std::invalid_argument);
  EXPECT_NO_THROW(interleaved_1f1b_schedule(3, 2, 2));  // fewer chunks than ranks: one round
}

TEST(ScheduleTest, AStageRunsOnOneRank) {
  Schedule s = interleaved_1f1b_schedule(2, 2, 2);
  s[1].push_back({Phase::kForward, 5, 0});
  std::string msg = error_of([&] { simulate(s, ActionCosts::uniform(4)); });
  EXPECT_NE(msg.find("stage 0 has actions on ranks 0 and 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1 "), std::string::npos) << msg;
  Schedule gap = interleaved_1f1b_schedule(2, 2, 2);
  for (auto& a : gap[0]) a.stage = a.stage == 2 ? 4 : a.stage;  // stage 2 renamed 4: none runs 2
  msg = error_of([&] { simulate(gap, ActionCosts::uniform(5)); });
  EXPECT_NE(msg.find("no rank runs stage 2"), std::string::npos) << msg;
}

TEST(ScheduleTest, ZBVPlacesTwoStagesPerRankInAV) {
  EXPECT_EQ(stage_placement(zbv_schedule(3, 6)), (std::vector<int64_t>{0, 1, 2, 2, 1, 0}));
  EXPECT_EQ(stage_placement(interleaved_1f1b_schedule(3, 2, 6)),
            (std::vector<int64_t>{0, 1, 2, 0, 1, 2}));
  const Schedule s = zbv_schedule(2, 3);
  EXPECT_EQ(stage_order(s, 0),
            "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0I0 0W0 3F2 3I2 3W2 0I1 0W1 0I2 0W2");
}

// Qi et al. (2024), section 6: with F, I and W alike ZB-V leaves no bubble but the first
// forward's way to the last rank, once the micro-batches fill the V (chunks >= 2 ranks - 1).
TEST(ScheduleTest, ZBVIdlesOnlyWhileTheFirstForwardTravels) {
  for (int64_t p = 1; p <= 4; ++p) {
    for (int64_t m = 1; m <= 16; ++m) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      const Schedule s = zbv_schedule(p, m);
      const Simulation sim = simulate(s, ActionCosts::uniform(2 * p, 1, 2, 1));
      EXPECT_NO_THROW(check_transfer_order(s));
      if (m >= 2 * p - 1) EXPECT_DOUBLE_EQ(sim.step_time, 6.0 * m + (p - 1));
    }
  }
}

TEST(ScheduleTest, EveryBuiltScheduleSendsInTheOrderItsNeighboursReceive) {
  for (int64_t p = 1; p <= 4; ++p) {
    for (int64_t m : {1, 2, 3, 4, 8}) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      for (const std::string name : {"gpipe", "1f1b", "zbh1", "zbh2"}) {
        EXPECT_NO_THROW(check_transfer_order(make_schedule(name, p, m))) << name;
      }
      if (m % std::max<int64_t>(1, m / p) == 0) {
        EXPECT_NO_THROW(check_transfer_order(interleaved_1f1b_schedule(p, 2, m)));
      }
      for (const Schedule& placed : {gpipe_schedule_placed(stage_placement(zbv_schedule(p, 2)), m),
                                     gpipe_schedule_placed({0, 0, 0}, m)}) {
        EXPECT_NO_THROW(simulate(placed, ActionCosts::uniform(stage_placement(placed).size())));
        EXPECT_NO_THROW(check_transfer_order(placed));
      }
    }
  }
}

TEST(ScheduleTest, TransfersOutOfOrderAreRefusedWithTheGrid) {
  // Stage 1 takes micro-batch 1 first: it would get micro-batch 0's activations for it.
  Schedule s = gpipe_schedule(2, 2);
  s[1] = parse("F1 F0 B1 B0");
  EXPECT_NO_THROW(simulate(s, ActionCosts::uniform(2)));  // no deadlock: only the order is wrong
  const std::string msg = error_of([&] { check_transfer_order(s); });
  EXPECT_NE(msg.find("stage 1 receives the activations of stage 0 in another order than they are "
                     "sent: its receive number 0 expects those of 0F1, but 0F0 sends that one"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("<-- ERROR HERE"), std::string::npos) << msg;
}

TEST(ScheduleTest, CsvFilesRoundTripInTorchsComputeOnlyFormat) {
  for (const std::string name : {"gpipe", "1f1b", "zbh1", "zbh2"}) {
    const Schedule s = make_schedule(name, 3, 4);
    EXPECT_EQ(parse_schedule_csv(schedule_csv(s)), s) << name;
  }
  EXPECT_EQ(parse_schedule_csv(schedule_csv(zbv_schedule(2, 3))), zbv_schedule(2, 3));
  EXPECT_EQ(schedule_csv(gpipe_schedule(2, 1)), "0F0,0B0\n1F0,1B0\n");
  // Idle slots (empty cells), spaces, CRLF and a trailing blank line, as _dump_csv may write.
  const Schedule s = parse_schedule_csv("0F0,,0B0\r\n, 1F0 ,1B0\n\n");
  EXPECT_EQ(s, gpipe_schedule(2, 1));
  for (const std::string bad : {"0F0,0X0", "F0", "0F", "0F1x", "12345678901F0"}) {
    const std::string msg = error_of([&] { parse_schedule_csv("1F0\n" + bad); });
    EXPECT_NE(msg.find("schedule line 2 (rank 1): cannot read the action"), std::string::npos)
        << bad << ": " << msg;
  }
}

TEST(ScheduleTest, MakeScheduleDispatchesByName) {
  EXPECT_EQ(schedule_names(),
            (std::vector<std::string>{"gpipe", "1f1b", "zbh1", "zbh2", "interleaved1f1b", "zbv"}));
  EXPECT_EQ(make_schedule("zbv", 2, 4, 2), zbv_schedule(2, 4));
  EXPECT_NE(error_of([] { make_schedule("zbv", 2, 4); }).find("exactly 2 stages per rank"),
            std::string::npos);
  EXPECT_EQ(make_schedule("interleaved1f1b", 2, 4, 2), interleaved_1f1b_schedule(2, 2, 4));
  const std::string msg = error_of([] { make_schedule("1f1b", 2, 4, 2); });
  EXPECT_NE(msg.find("'1f1b' runs one stage per rank, but virtual stages 2"), std::string::npos)
      << msg;
  EXPECT_EQ(make_schedule("gpipe", 3, 5), gpipe_schedule(3, 5));
  EXPECT_EQ(make_schedule("1f1b", 3, 5), one_f_one_b_schedule(3, 5));
  EXPECT_EQ(make_schedule("zbh1", 3, 5), zbh1_schedule(3, 5));
  EXPECT_EQ(make_schedule("zbh2", 3, 5), zbh2_schedule(3, 5));
}

TEST(ScheduleTest, UnknownNameListsKnownNames) {
  EXPECT_THROW(make_schedule("interleaved", 2, 2), std::invalid_argument);
  const std::string msg = error_of([] { make_schedule("interleaved", 2, 2); });
  EXPECT_NE(msg.find("'interleaved'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("gpipe, 1f1b, zbh1"), std::string::npos) << msg;
}

TEST(ScheduleTest, RejectsInvalidStagesAndChunks) {
  for (const auto& name : schedule_names()) {
    EXPECT_THROW(make_schedule(name, 0, 4), std::invalid_argument) << name;
    EXPECT_THROW(make_schedule(name, -1, 4), std::invalid_argument) << name;
    EXPECT_THROW(make_schedule(name, 2, 0), std::invalid_argument) << name;
    EXPECT_THROW(make_schedule(name, 2, -3), std::invalid_argument) << name;
  }
  EXPECT_NE(error_of([] { gpipe_schedule(0, 4); }).find("got 0"), std::string::npos);
  EXPECT_NE(error_of([] { one_f_one_b_schedule(2, -3); }).find("got -3"), std::string::npos);
  EXPECT_THROW(ActionCosts::uniform(0), std::invalid_argument);
}

TEST(ScheduleTest, UnitCostBubbleAndStepTimeMatchTheFormula) {
  for (const std::string name : {"gpipe", "1f1b"}) {
    for (int64_t p = 1; p <= 4; ++p) {
      for (int64_t m : {1, 2, 3, 4, 8, 16}) {
        SCOPED_TRACE(name + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        const Simulation sim = simulate(make_schedule(name, p, m), ActionCosts::uniform(p));
        EXPECT_DOUBLE_EQ(sim.step_time, 2.0 * (m + p - 1));
        EXPECT_NEAR(sim.bubble_fraction, double(p - 1) / double(m + p - 1), 1e-12);
        ASSERT_EQ(sim.busy_time.size(), static_cast<size_t>(p));
        ASSERT_EQ(sim.start_time.size(), static_cast<size_t>(p));
        for (int64_t s = 0; s < p; ++s) {
          EXPECT_DOUBLE_EQ(sim.busy_time[s], 2.0 * m);
          EXPECT_EQ(sim.start_time[s].size(), static_cast<size_t>(2 * m));
        }
      }
    }
  }
}

TEST(ScheduleTest, OneFOneBBoundsActivationsInFlightWhileGPipeHoldsAll) {
  for (int64_t p = 1; p <= 6; ++p) {
    for (int64_t m : {1, 2, 3, 4, 8, 16}) {
      const Schedule f1b1 = one_f_one_b_schedule(p, m);
      const Schedule gpipe = gpipe_schedule(p, m);
      for (int64_t s = 0; s < p; ++s) {
        EXPECT_LE(max_in_flight(f1b1[s]), p - s) << "p=" << p << " m=" << m << " s=" << s;
        EXPECT_EQ(max_in_flight(f1b1[s]), std::min(p - s, m));
        EXPECT_EQ(max_in_flight(gpipe[s]), m);
      }
    }
  }
}

TEST(ScheduleTest, StartTimesFollowDependencies) {
  const Schedule s = one_f_one_b_schedule(2, 3);
  const Simulation sim = simulate(s, ActionCosts::uniform(2));
  // 0F0 0F1 0B0 0F2 0B1 0B2 on stage 0; 1F0 1B0 1F1 1B1 1F2 1B2 on stage 1.
  EXPECT_EQ(sim.start_time[0], (std::vector<double>{0, 1, 3, 4, 5, 7}));
  EXPECT_EQ(sim.start_time[1], (std::vector<double>{1, 2, 3, 4, 5, 6}));
}

TEST(ScheduleTest, TransferLatencyAddsToEveryHop) {
  // GPipe's critical path crosses p-1 links on the way down and p-1 on the way back.
  for (int64_t p = 1; p <= 4; ++p) {
    for (int64_t m : {1, 4}) {
      ActionCosts costs = ActionCosts::uniform(p);
      costs.transfer = 0.5;
      const Simulation sim = simulate(gpipe_schedule(p, m), costs);
      EXPECT_DOUBLE_EQ(sim.step_time, 2.0 * (m + p - 1) + 2.0 * (p - 1) * 0.5);
    }
  }
}

TEST(ScheduleTest, UnevenCostsUseEachStagesOwnTimes) {
  ActionCosts costs;
  costs.forward = {1.0, 3.0};
  costs.backward = {2.0, 6.0};
  const Simulation sim = simulate(one_f_one_b_schedule(2, 2), costs);
  EXPECT_EQ(sim.busy_time, (std::vector<double>{6.0, 18.0}));
  // The slow stage 1 is busy from t=1 on: 1F0 1B0 1F1 1B1, then stage 0 finishes 0B1.
  EXPECT_DOUBLE_EQ(sim.step_time, 1.0 + 18.0 + 2.0);
  EXPECT_NEAR(sim.bubble_fraction, 1.0 - 24.0 / (2 * 21.0), 1e-12);
}

TEST(ScheduleTest, RejectsCostsThatDoNotMatchTheSchedule) {
  const Schedule s = gpipe_schedule(3, 2);
  EXPECT_THROW(simulate(s, ActionCosts::uniform(2)), std::invalid_argument);
  ActionCosts negative = ActionCosts::uniform(3);
  negative.backward[1] = -1.0;
  EXPECT_NE(error_of([&] { simulate(s, negative); }).find("backward[1]"), std::string::npos);
  EXPECT_THROW(simulate(Schedule{}, ActionCosts{}), std::invalid_argument);
}

// A row a stage, a column a time step, '.' where the stage idles: GPipe's grid, then 1F1B's.
TEST(ScheduleTest, FormatGPipeAndOneFOneBGrids) {
  EXPECT_EQ(format_schedule(gpipe_schedule(2, 2)),
            "        0    1    2    3    4    5\n"
            "stage 0 0F0  0F1  .    .    0B1  0B0\n"
            "stage 1 .    1F0  1F1  1B1  1B0  .\n");
  EXPECT_EQ(format_schedule(one_f_one_b_schedule(2, 3)),
            "        0    1    2    3    4    5    6    7\n"
            "stage 0 0F0  0F1  .    0B0  0F2  0B1  .    0B2\n"
            "stage 1 .    1F0  1B0  1F1  1B1  1F2  1B2  .\n");
}

TEST(ScheduleTest, FormatWidensCellsForLongNames) {
  const std::string grid = format_schedule(gpipe_schedule(1, 11));
  EXPECT_EQ(grid.substr(0, grid.find('\n')),
            "        0     1     2     3     4     5     6     7     8     9     10    11    12    "
            "13    14    15    16    17    18    19    20    21");
  EXPECT_NE(grid.find("stage 0 0F0   0F1   0F2   "), std::string::npos) << grid;
  EXPECT_NE(grid.find("0F9   0F10  0B10  0B9   "), std::string::npos) << grid;
}

TEST(ScheduleTest, BackwardBeforeForwardDeadlocksWithMarkedGrid) {
  Schedule s = gpipe_schedule(3, 2);
  s[1] = parse("B0 F0 F1 B1");
  EXPECT_THROW(simulate(s, ActionCosts::uniform(3)), std::runtime_error);
  const std::string msg = error_of([&] { simulate(s, ActionCosts::uniform(3)); });
  EXPECT_NE(msg.find("<-- ERROR HERE"), std::string::npos) << msg;
  EXPECT_NE(msg.find("stage 1 is stuck at 1B0, which waits for 2B0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("stage 1 .    .    | 1B0  1F0  1F1  1B1  <-- ERROR HERE\n"), std::string::npos)
      << msg;
  // format_schedule cannot draw a schedule that never finishes either.
  EXPECT_THROW(format_schedule(s), std::runtime_error);
}

TEST(ScheduleTest, CrossStageOrderConflictBlamesTheWaitingStage) {
  // Stage 2 wants 2F1 before 2B0, but stage 1 only sends F1 after it has run 1B0.
  Schedule s(3);
  s[0] = parse("F0 F1 B0 B1");
  s[1] = parse("F0 B0 F1 B1");
  s[2] = parse("F0 F1 B0 B1");
  const std::string msg = error_of([&] { simulate(s, ActionCosts::uniform(3)); });
  EXPECT_NE(msg.find("stage 1 is stuck at 1B0, which waits for 2B0 (stage 2 only gets to it after "
                     "2F1, which is stuck)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("stage 0 0F0  0F1  .    | 0B0  0B1\n"
                     "stage 1 .    1F0  .    | 1B0  1F1  1B1  <-- ERROR HERE\n"
                     "stage 2 .    .    2F0  | 2F1  2B0  2B1\n"),
            std::string::npos)
      << msg;
}

TEST(ScheduleTest, MissingOrRepeatedActionsAreReported) {
  Schedule missing = one_f_one_b_schedule(2, 3);
  missing[1].pop_back();  // drops 1B2
  std::string msg = error_of([&] { simulate(missing, ActionCosts::uniform(2)); });
  EXPECT_NE(msg.find("stage 1 has no 1B2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("<-- ERROR HERE"), std::string::npos) << msg;
  EXPECT_THROW(simulate(missing, ActionCosts::uniform(2)), std::runtime_error);

  Schedule repeated = gpipe_schedule(2, 2);
  repeated[0][1] = {Phase::kForward, 0};
  msg = error_of([&] { format_schedule(repeated); });
  EXPECT_NE(msg.find("stage 0 runs 0F0 twice"), std::string::npos) << msg;

  Schedule uneven = gpipe_schedule(2, 2);
  uneven[1] = parse("F0 F1 F2 B2 B1 B0");  // stage 1 thinks there are 3 chunks
  msg = error_of([&] { simulate(uneven, ActionCosts::uniform(2)); });
  EXPECT_NE(msg.find("stage 0 has no 0F2"), std::string::npos) << msg;

  Schedule huge = gpipe_schedule(1, 1);
  huge[0][0].microbatch = int64_t{1} << 40;
  EXPECT_THROW(simulate(huge, ActionCosts::uniform(1)), std::runtime_error);
}

}  // namespace
}  // namespace pipetrain::schedule_test
