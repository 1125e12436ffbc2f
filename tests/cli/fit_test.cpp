// The `pipetrain fit` contract, run as a user runs it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "support/command.h"
#include "support/multiprocess.h"

namespace pipetrain::testing::fit_test {
namespace {

// Fits the MLP as one process into ROOT/single, then with `pipe_flags` into ROOT/pipe, asserting
// that both succeed (under ASSERT_NO_FATAL_FAILURE); `pipe` gets what the second run printed.
void fit_single_then_pipe(const std::string& root, const std::vector<std::string>& pipe_flags,
                          CommandResult* pipe) {
  const auto single = run_command(mlp_fit_command(root + "/single", {"--strategy", "single"}));
  ASSERT_EQ(single.exit_code, 0) << single.output;
  *pipe = run_command(mlp_fit_command(root + "/pipe", pipe_flags));
  ASSERT_EQ(pipe->exit_code, 0) << pipe->output;
}

TEST(FitCommand, PipeOnTwoDevicesLogsTheSameLossesAsSingle) {
#ifndef PIPETRAIN_HAS_GLOO
  GTEST_SKIP() << "this libtorch has no Gloo for CPU ranks";
#endif
  const auto root = make_temp_dir("fit-cli");
  CommandResult pipe;
  ASSERT_NO_FATAL_FAILURE(
      fit_single_then_pipe(root,
                           {"--strategy", "pipe", "--devices", "2", "--chunks", "3", "--schedule",
                            "1f1b", "--checkpoint", "always"},
                           &pipe));

  ASSERT_EQ(read_csv_column(metrics_csv(root + "/single"), "train_loss").size(), 12u);
  expect_same_train_losses(root + "/single", root + "/pipe");
  EXPECT_EQ(read_csv_column(metrics_csv(root + "/pipe"), "step").back(), 11);
  EXPECT_NE(pipe.output.find("lightning_logs/version_0"), std::string::npos) << pipe.output;
  // hparams.yaml holds what ran: single runs one micro-batch with nothing to recompute.
  auto hparams = [&](const std::string& run) {
    std::ifstream in(root + "/" + run + "/lightning_logs/version_0/hparams.yaml");
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  EXPECT_NE(hparams("pipe").find("checkpoint: always\nchunks: 3\n"), std::string::npos)
      << hparams("pipe");
  EXPECT_NE(hparams("pipe").find("stages: 2\n"), std::string::npos) << hparams("pipe");
  EXPECT_NE(hparams("single").find("checkpoint: never\nchunks: 1\n"), std::string::npos)
      << hparams("single");
  std::filesystem::remove_all(root);
}

// Schedule auto times two steps of zbh1, says what it predicts for each candidate, and trains on
// with its pick, among those that fit --max-in-flight, as one process does.
TEST(FitCommand, ScheduleAutoPrintsItsCandidatesAndTrainsAsSingle) {
#ifndef PIPETRAIN_HAS_GLOO
  GTEST_SKIP() << "this libtorch has no Gloo for CPU ranks";
#endif
  const auto root = make_temp_dir("fit-cli");
  CommandResult pipe;
  ASSERT_NO_FATAL_FAILURE(fit_single_then_pipe(root,
                                               {"--strategy", "pipe", "--devices", "2", "--chunks",
                                                "4", "--schedule", "auto", "--max-in-flight", "2"},
                                               &pipe));
  EXPECT_NE(pipe.output.find("pipetrain: schedule auto: per micro-batch F/I/W ms by stage: 0: "),
            std::string::npos)
      << pipe.output;
  EXPECT_NE(pipe.output.find("predicted step:"), std::string::npos) << pipe.output;
  for (const std::string candidate : {" 1f1b ", " zbh1 ", " zbh2 ", " gpipe "}) {
    EXPECT_NE(pipe.output.find(candidate), std::string::npos) << candidate << pipe.output;
  }
  // Two stages, four micro-batches: zbh2 holds three micro-batches' activations, gpipe four.
  EXPECT_NE(pipe.output.find("(holds 2)"), std::string::npos) << pipe.output;
  EXPECT_NE(pipe.output.find("(holds 3, too many)"), std::string::npos) << pipe.output;
  EXPECT_NE(pipe.output.find("(holds 4, too many)"), std::string::npos) << pipe.output;
  const size_t running = pipe.output.find("; running ");
  ASSERT_NE(running, std::string::npos) << pipe.output;
  const std::string pick = pipe.output.substr(running + 10, 4);
  EXPECT_TRUE(pick == "1f1b" || pick == "zbh1") << pipe.output;
  expect_same_train_losses(root + "/single", root + "/pipe");
  // Without a memory limit zbh1 and zbh2 are both in. On two stages their predictions differ
  // only by the noise in the profiled times, so they usually fall within the tie and each runs
  // two timed steps in turns, the schedule switching between steps; a noisy profile may also
  // separate them. Whichever way the choice goes, training still equals one process.
  const auto tried =
      run_command(mlp_fit_command(root + "/tried", {"--strategy", "pipe", "--devices", "2",
                                                    "--chunks", "4", "--schedule", "auto"}));
  ASSERT_EQ(tried.exit_code, 0) << tried.output;
  const size_t trying = tried.output.find("so timing 2 steps of each:");
  if (trying != std::string::npos) {
    const std::string finalists =
        tried.output.substr(trying, tried.output.find('\n', trying) - trying);
    EXPECT_NE(finalists.find(" zbh"), std::string::npos) << finalists;
    EXPECT_NE(tried.output.find("pipetrain: schedule auto: measured step (fastest of 2):"),
              std::string::npos)
        << tried.output;
  } else {
    EXPECT_NE(tried.output.find("; running "), std::string::npos) << tried.output;
  }
  expect_same_train_losses(root + "/single", root + "/tried");
  const auto refused = run_command(
      mlp_fit_command(root + "/v2", {"--strategy", "pipe", "--devices", "2", "--chunks", "4",
                                     "--schedule", "auto", "--virtual-stages", "2"}));
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("schedule 'auto' chooses among 1f1b, zbh1, zbh2 and gpipe"),
            std::string::npos)
      << refused.output;
  const auto too_little = run_command(
      mlp_fit_command(root + "/m1", {"--strategy", "pipe", "--devices", "2", "--chunks", "4",
                                     "--schedule", "auto", "--max-in-flight", "1"}));
  EXPECT_NE(too_little.exit_code, 0);
  EXPECT_NE(too_little.output.find("schedule 'auto' holds up to 2 micro-batches' activations on "
                                   "a stage, more than max_in_flight (--max-in-flight) 1"),
            std::string::npos)
      << too_little.output;
  std::filesystem::remove_all(root);
}

// `single` runs the whole batch at once, but the pipe flags that still mean something reach it:
// fused accumulation trains the same, and CUDA graphs say why they do not run on a CPU.
TEST(FitCommand, SingleHonoursCudaGraphsAndFusedAccumulation) {
  const auto root = make_temp_dir("fit-single-flags");
  const auto plain = run_command(mlp_fit_command(root + "/plain", {"--strategy", "single"}));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const auto flagged = run_command(mlp_fit_command(
      root + "/flagged",
      {"--strategy", "single", "--cuda-graphs", "true", "--fuse-gradient-accumulation", "true"}));
  ASSERT_EQ(flagged.exit_code, 0) << flagged.output;
  EXPECT_NE(flagged.output.find("not using CUDA graphs: they need a CUDA device"),
            std::string::npos)
      << flagged.output;
  expect_same_train_losses(root + "/plain", root + "/flagged");
  std::filesystem::remove_all(root);
}

// Under bf16-mixed the fused Linear layers run autocast's bf16 GEMMs and add into the fp32
// gradients: the run trains as the unfused one does, within bf16's rounding of the weight
// gradients (relative 1e-2 on the losses of 12 steps). CUDA graphs capture autocast's casts, so
// bf16-mixed does not turn them off (here, on a CPU, they need a device).
TEST(FitCommand, Bf16MixedFusesGradientAccumulationToo) {
  const auto root = make_temp_dir("fit-fused-bf16-mixed");
  const auto plain = run_command(mlp_fit_command(root + "/plain", {"--precision", "bf16-mixed"}));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const auto fused = run_command(
      mlp_fit_command(root + "/fused", {"--precision", "bf16-mixed", "--fuse-gradient-accumulation",
                                        "true", "--cuda-graphs", "true"}));
  ASSERT_EQ(fused.exit_code, 0) << fused.output;
  expect_same_train_losses(root + "/plain", root + "/fused", 1e-2);
  const std::string said = "not using CUDA graphs: they need a CUDA device";
  EXPECT_NE(fused.output.find(said), std::string::npos) << fused.output;
  EXPECT_EQ(fused.output.find(said), fused.output.rfind(said)) << "said twice: " << said;
  EXPECT_EQ(fused.output.find("does nothing"), std::string::npos) << fused.output;
  EXPECT_EQ(fused.output.find("autocast (bf16-mixed)"), std::string::npos) << fused.output;
  std::filesystem::remove_all(root);
}

// Runs started at once on one root each claim a version folder of their own: run i trains 2 + i
// steps, so every folder's metrics.csv must hold one run's steps, all of them.
TEST(FitCommand, ConcurrentRunsOnOneRootGetAFolderEach) {
  const auto root = make_temp_dir("fit-concurrent");
  constexpr int kRuns = 10;
  std::vector<RunningCommand> runs;
  for (int i = 0; i < kRuns; ++i) runs.push_back(start_command(mlp_fit_command(root, {}, 2 + i)));
  for (const auto& run : runs) {
    const auto result = wait_command(run, std::chrono::seconds(300));
    ASSERT_EQ(result.exit_code, 0) << result.output;
  }
  std::set<size_t> step_counts;
  for (int version = 0; version < kRuns; ++version) {
    const auto csv = root + "/lightning_logs/version_" + std::to_string(version) + "/metrics.csv";
    const auto losses = read_csv_column(csv, "train_loss");
    const auto steps = read_csv_column(csv, "step");
    ASSERT_FALSE(losses.empty()) << csv;
    // One loss per step, steps 0 to n - 1 (other rows, the learning rate's, repeat steps).
    const std::set<double> distinct(steps.begin(), steps.end());
    EXPECT_EQ(distinct.size(), losses.size()) << csv;
    EXPECT_EQ(*distinct.rbegin(), static_cast<double>(losses.size() - 1)) << csv;
    step_counts.insert(losses.size());
  }
  EXPECT_EQ(step_counts.size(), static_cast<size_t>(kRuns));
  EXPECT_EQ(*step_counts.begin(), 2u);
  EXPECT_EQ(*step_counts.rbegin(), static_cast<size_t>(kRuns + 1));
  EXPECT_FALSE(std::filesystem::exists(root + "/lightning_logs/version_" + std::to_string(kRuns)));
  std::filesystem::remove_all(root);
}

TEST(FitCommand, HelpListsEveryFlagWithItsDefault) {
  const auto help = run_command({PIPETRAIN_CLI, "fit", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  for (const char* flag :
       {"--model", "--strategy", "--devices", "--balance", "--chunks", "--checkpoint", "--schedule",
        "--max-epochs", "--max-steps", "--batch-size", "--lr", "--seed", "--default-root-dir",
        "--log-every-n-steps"}) {
    EXPECT_NE(help.output.find(flag), std::string::npos) << flag;
  }
  EXPECT_NE(help.output.find("except_last"), std::string::npos) << help.output;
  const auto top = run_command({PIPETRAIN_CLI, "--help"});
  EXPECT_EQ(top.exit_code, 0);
  EXPECT_NE(top.output.find("fit"), std::string::npos);
}

}  // namespace
}  // namespace pipetrain::testing::fit_test

namespace pipetrain::testing::fit_test {
namespace {

TEST(FitCommand, ConfigFileEnvironmentAndFlagsInThatOrderOfStrength) {
  const auto root = make_temp_dir("config");
  const auto config = root + "/config.json";
  std::ofstream(config) << R"({"model": "boring", "max_steps": 3, "log_every_n_steps": 1,
                               "logger": ["csv"], "batch_size": 16})";
  // The config says 3 steps, the environment 5, the command line 4.
  const auto result = run_command(
      {PIPETRAIN_CLI, "fit", "--config", config, "--max-steps", "4", "--default-root-dir", root},
      {{"PIPETRAIN_MAX_STEPS", "5"}, {"PIPETRAIN_SEED", "9"}});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(read_csv_column(root + "/lightning_logs/version_0/metrics.csv", "train_loss").size(),
            4u);
  const auto from_env =
      run_command({PIPETRAIN_CLI, "fit", "--config", config, "--default-root-dir", root},
                  {{"PIPETRAIN_MAX_STEPS", "5"}});
  ASSERT_EQ(from_env.exit_code, 0) << from_env.output;
  EXPECT_EQ(read_csv_column(root + "/lightning_logs/version_1/metrics.csv", "train_loss").size(),
            5u);

  std::ofstream(config) << R"({"max_stepz": 3})";
  const auto bad = run_command({PIPETRAIN_CLI, "fit", "--config", config});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("unknown key 'max_stepz'"), std::string::npos) << bad.output;
  std::filesystem::remove_all(root);
}

TEST(PredictCommand, PipeReturnsTheSamePredictionsInTheSameOrderAsSingle) {
  const auto root = make_temp_dir("predict");
  auto predict = [&](const std::vector<std::string>& strategy) {
    return run_command(
        pipetrain_command({"predict", "--model", "mlp", "--seed", "4", "--default-root-dir", root,
                           "--logger", "none", "--limit-predict-batches", "3"},
                          strategy));
  };
  const auto one = predict({});
  const auto three = predict({"--strategy", "pipe", "--devices", "3", "--chunks", "5"});
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(three.exit_code, 0) << three.output;
  auto predictions = [](const std::string& output) {
    const auto at = output.find("predicted ");
    return at == std::string::npos ? std::string() : output.substr(at, output.find('\n', at) - at);
  };
  EXPECT_NE(predictions(one.output).find("predicted 96 rows"), std::string::npos) << one.output;
  EXPECT_EQ(predictions(three.output), predictions(one.output));
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace pipetrain::testing::fit_test
