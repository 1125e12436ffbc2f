// `--trace`: a Chrome-trace file with every rank's spans, in the order the schedule ran them.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "pipeline/trace.h"
#include "pipetrain/world.h"
#include "support/command.h"
#include "support/multiprocess.h"

namespace pipetrain::testing::trace_test {
namespace {

TEST(Trace, FitWritesEveryRanksSpansInScheduleOrder) {
  // Two ranks under `auto` take a GPU each where there are GPUs.
  if (torch::cuda::device_count() == 1) GTEST_SKIP() << "needs 2 CUDA devices (or none)";
  const auto root = make_temp_dir("trace");
  const auto path = root + "/trace.json";
  const auto result = run_command(
      {PIPETRAIN_CLI, "fit", "--model", "mlp", "--strategy", "pipe", "--devices", "2", "--chunks",
       "2", "--max-steps", "3", "--batch-size", "8", "--default-root-dir", root, "--trace", path},
      {{"PIPETRAIN_ACCELERATOR", "auto"}});  // on GPUs where there are some
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::ifstream in(path);
  const auto trace = nlohmann::json::parse(in);

  std::map<int, std::vector<nlohmann::json>> spans;  // rank -> spans in file order
  for (const auto& event : trace.at("traceEvents")) {
    if (event.at("ph") == "X") spans[event.at("pid").get<int>()].push_back(event);
  }
  ASSERT_EQ(spans.size(), 2u);
  std::map<int, std::set<std::string>> names;
  for (const auto& [rank, events] : spans) {
    double previous_start = -1;
    for (const auto& event : events) {
      names[rank].insert(event.at("name").get<std::string>());
      EXPECT_GE(event.at("dur").get<double>(), 0);
      previous_start = event.at("ts").get<double>();
      EXPECT_GE(previous_start, 0);
    }
  }
  for (const auto* name : {"forward 0", "forward 1", "backward 0", "backward 1",
                           "send activation 0", "recv gradient 1", "optimizer"}) {
    EXPECT_TRUE(names[0].count(name)) << "rank 0 lacks " << name;
  }
  for (const auto* name :
       {"recv activation 0", "forward 1", "backward 0", "send gradient 1", "optimizer"}) {
    EXPECT_TRUE(names[1].count(name)) << "rank 1 lacks " << name;
  }
  // 3 steps x 2 micro-batches x (forward, backward, send, receive) + 3 optimizer steps per rank,
  // and on CPUs (Gloo) one receive a step posted ahead: the second gradient's, once the first
  // has come.
  const auto posted = std::count_if(spans[0].begin(), spans[0].end(), [](const auto& event) {
    return event.at("name").template get<std::string>().rfind("post receive", 0) == 0;
  });
  EXPECT_EQ(posted, torch::cuda::is_available() ? 0 : 3);
  EXPECT_EQ(spans[0].size() - static_cast<size_t>(posted), 3u * 2 * 4 + 3);
  // Stage 1 cannot start micro-batch 0 before stage 0 has finished it.
  auto first = [](const std::vector<nlohmann::json>& events, const std::string& name) {
    for (const auto& event : events) {
      if (event.at("name") == name) return event;
    }
    return nlohmann::json();
  };
  const auto stage0_forward = first(spans[0], "forward 0");
  const auto stage1_forward = first(spans[1], "forward 0");
  EXPECT_GE(stage1_forward.at("ts").get<double>(),
            stage0_forward.at("ts").get<double>() + stage0_forward.at("dur").get<double>() - 1000)
      << "(1 ms of slack for the ranks' clocks)";
  std::filesystem::remove_all(root);
}

// total_ms() is what the written file says, added up by span name (benchmarks read busy times
// from it).
TEST(Trace, TotalsAddUpTheSpansOfEachName) {
  World world;
  Trace trace;
  trace.start(world);
  for (int i = 0; i < 3; ++i) {
    auto forward = trace.span("forward", i);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  { auto step = trace.span("optimizer"); }
  const auto totals = trace.total_ms();
  const auto root = make_temp_dir("trace-totals");
  trace.write(world, root + "/trace.json");
  std::ifstream in(root + "/trace.json");
  const auto file = nlohmann::json::parse(in);
  std::map<std::string, double> from_file;
  for (const auto& event : file.at("traceEvents")) {
    if (event.at("ph") == "X") {
      from_file[event.at("cat").get<std::string>()] += event.at("dur").get<double>() / 1e3;
    }
  }
  ASSERT_EQ(totals.size(), 2u);
  EXPECT_NEAR(totals.at("forward"), from_file.at("forward"), 1e-4);
  EXPECT_NEAR(totals.at("optimizer"), from_file.at("optimizer"), 1e-4);
  EXPECT_GE(totals.at("forward"), 6.0) << "three spans of at least 2 ms";
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace pipetrain::testing::trace_test
