// A schedule of one's own (PipeOptions::schedule_file, torch.distributed.pipelining's
// compute-only CSV): checked against the pipe before the first step, with a clear error, and
// trained as single-process training is (fp32, relative 1e-5 and absolute 1e-6, as
// pipe_equivalence_test).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "pipetrain/cluster_environment.h"
#include "pipetrain/pipe.h"
#include "pipetrain/schedule.h"
#include "pipetrain/world.h"
#include "support/errors.h"
#include "support/multiprocess.h"
#include "support/reference.h"

namespace pipetrain::testing::schedule_file_test {
namespace {

constexpr uint64_t kSeed = 7;

// Neither a built-in schedule nor a sensible one, but a valid one: stage 0 takes both
// micro-batches through a whole backward, stage 1 splits its backwards and leaves both W's to
// the end.
constexpr char kOwnSchedule[] =
    "0F0,0F1,,,0B0,0B1\n"
    ",1F0,1I0,1F1,1I1,1W1,1W0\n";

std::string write_file(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

PIPETRAIN_WORKER(schedule_file_worker) {
  auto world = World::connect(*select_cluster_environment());
  const std::string dir = env_or("RESULT_DIR", ".");
  Pipe pipe(make_reference_model(kSeed),
            PipeOptions().chunks(2).schedule_file(dir + "/own.csv").checkpoint("never"), world);
  std::vector<at::Tensor> saved{train_reference_pipe(pipe)};
  for (const auto& p : pipe.parameters()) saved.push_back(p.detach());
  torch::save(saved, dir + "/rank" + std::to_string(world->rank()) + ".pt");
}

TEST(ScheduleFile, AScheduleOfOnesOwnTrainsAsOneProcess) {
  const auto dir = make_temp_dir("schedule-file");
  write_file(dir, "own.csv", kOwnSchedule);
  ASSERT_EQ(run_ranks(2, "schedule_file_worker", {{"RESULT_DIR", dir}}), 0);
  const auto expected = train_single_process(make_reference_model(kSeed));
  std::vector<at::Tensor> parameters;
  std::vector<at::Tensor> last;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<at::Tensor> saved;
    torch::load(saved, dir + "/rank" + std::to_string(rank) + ".pt");
    parameters.insert(parameters.end(), saved.begin() + 1, saved.end());
    last = saved;
  }
  for (int64_t step = 0; step < kSteps; ++step) {
    EXPECT_NEAR(last[0][step].item<double>(), expected.losses[step],
                1e-5 * std::abs(expected.losses[step]));
  }
  ASSERT_EQ(parameters.size(), expected.parameters.size());
  for (size_t i = 0; i < parameters.size(); ++i) {
    EXPECT_TRUE(torch::allclose(parameters[i], expected.parameters[i], 1e-5, 1e-6))
        << "parameter " << i;
  }
  std::filesystem::remove_all(dir);
}

TEST(ScheduleFile, WhatCannotRunIsRefusedBeforeTheFirstStep) {
  const auto dir = make_temp_dir("schedule-file");
  auto world = std::make_shared<World>();
  auto pipe_with = [&](const std::string& text, int64_t chunks, int64_t virtual_stages) {
    const std::string path = write_file(dir, "schedule.csv", text);
    Pipe(make_reference_model(kSeed),
         PipeOptions().chunks(chunks).virtual_stages(virtual_stages).schedule_file(path), world);
  };
  std::string msg = error_of([&] {
    Pipe(make_reference_model(kSeed), PipeOptions().schedule_file(dir + "/none.csv"), world);
  });
  EXPECT_NE(msg.find("cannot read the schedule file '" + dir + "/none.csv'"), std::string::npos)
      << msg;

  msg = error_of([&] { pipe_with("0F0,0F1,0B1\n", 2, 1); });
  EXPECT_NE(msg.find("stage 0 has no 0B0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("<-- ERROR HERE"), std::string::npos) << msg;

  msg = error_of([&] { pipe_with("0F0,0F1,0B1,0B1,0B0\n", 2, 1); });
  EXPECT_NE(msg.find("stage 0 runs 0B1 twice"), std::string::npos) << msg;
  EXPECT_NE(msg.find("<-- ERROR HERE"), std::string::npos) << msg;

  msg = error_of([&] { pipe_with("0F0,0B0\n1F0,1B0\n", 1, 1); });
  EXPECT_NE(msg.find("has 2 lines (ranks) but 1 processes run the pipeline"), std::string::npos)
      << msg;

  msg = error_of([&] { pipe_with("0F0,1F0,1B0,0B0\n", 1, 1); });
  EXPECT_NE(msg.find("runs 2 stages on 1 ranks but the pipe has 1"), std::string::npos) << msg;
  EXPECT_NO_THROW(pipe_with("0F0,1F0,1B0,0B0\n", 1, 2));  // two stages on the one rank

  msg = error_of([&] { pipe_with("0F0,0F1,0B1,0B0\n", 3, 1); });
  EXPECT_NE(msg.find("runs 2 micro-batches but chunks is 3"), std::string::npos) << msg;

  // Between two stages of one rank the order is free: they hand over by micro-batch.
  msg = error_of([&] { pipe_with("0F0,0F1,1F0,1F1,1B0,1B1,0B1,0B0\n", 2, 2); });
  EXPECT_EQ(msg, "<no exception>") << "within a rank, stages hand over by micro-batch";

  msg = error_of([&] { pipe_with("0F0,0Z0\n", 1, 1); });
  EXPECT_NE(msg.find("cannot read the action '0Z0'"), std::string::npos) << msg;
  std::filesystem::remove_all(dir);
}

// PipeOptions::max_in_flight: a schedule (built or from a file) that holds more micro-batches'
// activations on a stage is refused before the first step, naming both numbers.
TEST(ScheduleFile, MaxMemoryRefusesAScheduleThatHoldsMore) {
  const auto dir = make_temp_dir("schedule-file");
  auto world = std::make_shared<World>();
  const std::string path = write_file(dir, "gpipe.csv", schedule_csv(gpipe_schedule(1, 3)));
  std::string msg = error_of([&] {
    Pipe(make_reference_model(kSeed), PipeOptions().chunks(3).schedule_file(path).max_in_flight(2),
         world);
  });
  EXPECT_NE(msg.find("the schedule of '" + path +
                     "' holds up to 3 micro-batches' activations on "
                     "a stage, more than max_in_flight (--max-in-flight) 2"),
            std::string::npos)
      << msg;
  msg = error_of(
      [&] { Pipe(make_reference_model(kSeed), PipeOptions().chunks(4).max_in_flight(3), world); });
  EXPECT_NE(msg.find("schedule 'gpipe' holds up to 4"), std::string::npos) << msg;
  EXPECT_EQ(error_of([&] {
              Pipe(make_reference_model(kSeed), PipeOptions().chunks(4).max_in_flight(4), world);
            }),
            "<no exception>");
  msg = error_of(
      [&] { Pipe(make_reference_model(kSeed), PipeOptions().chunks(4).max_in_flight(-1), world); });
  EXPECT_NE(msg.find("max_in_flight (--max-in-flight) must be 0 (no limit)"), std::string::npos)
      << msg;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pipetrain::testing::schedule_file_test
