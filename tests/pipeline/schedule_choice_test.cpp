// Schedule "auto"'s choice (src/pipeline/schedule_choice.h): the simulator decides where it can,
// the measured steps of its finalists where it cannot.
#include "../../src/pipeline/schedule_choice.h"  // internal: the choice itself is tested here

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace pipetrain::testing::schedule_choice_test {
namespace {

using Prediction = ScheduleChoice::Prediction;

// A choice past its profile: two profiled steps, the second counting.
ScheduleChoice profiled() {
  ScheduleChoice choice;
  EXPECT_TRUE(choice.profiling());
  EXPECT_EQ(choice.running(), "zbh1");  // its split backwards time F, I and W apart
  EXPECT_FALSE(choice.count_profiled_step());
  EXPECT_TRUE(choice.count_profiled_step());
  return choice;
}

TEST(ScheduleChoice, TheSimulatorsClearWinnerRunsAtOnce) {
  ScheduleChoice choice = profiled();
  const std::string said = choice.predicted({{"1f1b", 0.100, 2, true},
                                             {"zbh1", 0.080, 2, true},
                                             {"zbh2", 0.070, 3, false},  // fastest, too big
                                             {"gpipe", 0.100, 4, true}});
  EXPECT_TRUE(choice.chosen());
  EXPECT_EQ(choice.running(), "zbh1");
  EXPECT_NE(said.find("zbh2 70.00 ms (holds 3, too many)"), std::string::npos) << said;
  EXPECT_NE(said.find("; running zbh1"), std::string::npos) << said;
}

TEST(ScheduleChoice, CandidatesTheSimulatorCannotSeparateRunInTurnsAndTheFastestIsKept) {
  ScheduleChoice choice = profiled();
  const std::string said = choice.predicted({{"1f1b", 0.100, 2, true},
                                             {"zbh1", 0.0800, 2, true},
                                             {"zbh2", 0.0805, 3, true},  // within 1% of zbh1
                                             {"gpipe", 0.100, 4, true}});
  EXPECT_FALSE(choice.chosen());
  EXPECT_NE(said.find("timing 2 steps of each: zbh1 zbh2"), std::string::npos) << said;
  // zbh1, zbh2, zbh1, zbh2; each one's fastest step counts.
  const std::vector<std::pair<std::string, double>> steps = {
      {"zbh1", 0.090}, {"zbh2", 0.078}, {"zbh1", 0.081}, {"zbh2", 0.085}};
  std::string last;
  for (const auto& [schedule, seconds] : steps) {
    ASSERT_FALSE(choice.chosen());
    EXPECT_EQ(choice.running(), schedule);
    last = choice.tried(seconds);
    if (!choice.chosen()) EXPECT_EQ(last, "");
  }
  EXPECT_TRUE(choice.chosen());
  EXPECT_EQ(choice.running(), "zbh2");
  EXPECT_NE(last.find("zbh1 81.00 ms zbh2 78.00 ms; running zbh2"), std::string::npos) << last;
}

TEST(ScheduleChoice, OfFinalistsMeasuredAlikeTheOneHoldingFewerActivationsIsKept) {
  ScheduleChoice choice = profiled();
  choice.predicted({{"1f1b", 0.0801, 2, true},
                    {"zbh1", 0.0800, 2, true},
                    {"zbh2", 0.0800, 3, true},
                    {"gpipe", 0.0801, 4, true}});
  ASSERT_FALSE(choice.chosen());
  // gpipe and zbh2 measure 0.4% faster than zbh1, 1f1b 1% slower: zbh1 holds fewer.
  for (int round = 0; round < ScheduleChoice::kTrialRounds; ++round) {
    for (const auto& [schedule, seconds] : std::vector<std::pair<std::string, double>>{
             {"1f1b", 0.1010}, {"zbh1", 0.1004}, {"zbh2", 0.1000}, {"gpipe", 0.1000}}) {
      EXPECT_EQ(choice.running(), schedule);
      choice.tried(seconds);
    }
  }
  EXPECT_TRUE(choice.chosen());
  EXPECT_EQ(choice.running(), "zbh1");
}

TEST(ScheduleChoice, StepsOutOfTurnAreRefused) {
  ScheduleChoice choice;
  EXPECT_THROW(choice.tried(0.1), std::logic_error);
  choice.predicted({{"1f1b", 0.1, 2, true}});
  EXPECT_THROW(choice.predicted({{"1f1b", 0.1, 2, true}}), std::logic_error);
}

}  // namespace
}  // namespace pipetrain::testing::schedule_choice_test
