// Bad input ends the run: a non-zero exit within 60 s and a message naming the value (or the rank)
// and what to do. Nothing hangs.
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "pipetrain/cluster_environment.h"
#include "pipetrain/launcher.h"
#include "pipetrain/pipe.h"
#include "pipetrain/world.h"
#include "support/command.h"
#include "support/multiprocess.h"

namespace pipetrain::testing::bad_input_test {
namespace {

namespace fs = std::filesystem;

constexpr auto kLimit = std::chrono::seconds(60);

CommandResult fit(const std::vector<std::string>& flags) {
  return run_command(pipetrain_command({"fit", "--model", "mlp", "--max-steps", "3",
                                        "--default-root-dir", make_temp_dir("bad-input")},
                                       flags),
                     {}, kLimit);
}

void expect_failure_mentioning(const CommandResult& result, const std::vector<std::string>& parts) {
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.exit_code, 137) << "timed out:\n" << result.output;
  EXPECT_LT(result.seconds, kLimit.count());
  for (const auto& part : parts) {
    EXPECT_NE(result.output.find(part), std::string::npos) << "expected '" << part << "' in:\n"
                                                           << result.output;
  }
}

// Counts and limits out of range are refused before anything runs, naming option and flag, with
// the usage status (2).
TEST(BadInput, OutOfRangeValuesNameTheirFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{"--val-check-interval", "0"}, "val_check_interval (--val-check-interval) must be"},
      {{"--val-check-interval", "0.0"}, "val_check_interval (--val-check-interval) must be"},
      {{"--gradient-clip-val=-1"}, "gradient_clip_val (--gradient-clip-val) must be at least 0"},
      {{"--max-time=-5"}, "max_time (--max-time) must be at least 0"},
      {{"--accumulate-grad-batches", "0"}, "accumulate_grad_batches (--accumulate-grad-batches)"},
      {{"--chunks", "0"}, "chunks (--chunks) must be at least 1"},
      {{"--devices", "0"}, "devices (--devices) must be at least 1"},
      {{"--limit-train-batches", "1.5"}, "between 0.0 and 1.0"},
      {{"--max-memory", "40GiBs"}, "--max-memory 40GiBs: give a number of bytes"},
      {{"--max-memory", "nan"}, "--max-memory nan: give a number of bytes"},
      {{"--max-memory", "1e19"}, "--max-memory 1e19 is more bytes than any machine holds"},
      {{"--max-memory", "1e30"}, "--max-memory 1e30 is more bytes than any machine holds"},
      {{"--max-memory", "inf"}, "--max-memory inf is more bytes than any machine holds"},
      {{"--device-memory", "1e30"}, "--device-memory 1e30 is more bytes than any machine holds"},
      {{"--timeout", "10000000000000000"},
       "--timeout 10000000000000000: give at most 1000000000 seconds"},
      {{"--max-time", "nan"}, "--max-time nan: give at most 1000000000 seconds"},
      {{"--max-time", "inf"}, "--max-time inf: give at most 1000000000 seconds"},
  };
  for (const auto& [flags, expected] : cases) {
    SCOPED_TRACE(flags[0]);
    const auto result = fit(flags);
    expect_failure_mentioning(result, {expected});
    EXPECT_EQ(result.exit_code, 2) << result.output;
  }
}

// A flag the model (or its schedule) does not read is refused, not ignored; so are a Llama's 32-bit
// tokens read as 16-bit and a sequence longer than the model's positions.
TEST(BadInput, FlagsAModelDoesNotReadAndTokensItCannotHold) {
  const std::string dir = make_temp_dir("bad-input-llama");
  ASSERT_EQ(run_command(pipetrain_command({"prepare-data", "--input",
                                           "/usr/share/common-licenses/GPL-3", "--output", dir}))
                .exit_code,
            0);
  const std::vector<std::string> tiny{"--n-layer",    "1",  "--n-embd",     "16",
                                      "--n-head",     "2",  "--train-data", dir + "/train.bin",
                                      "--vocab-size", "256"};
  std::vector<std::string> tiny_llama = tiny;
  tiny_llama.insert(tiny_llama.end(), {"--n-kv-head", "1", "--intermediate-size", "32"});
  const auto with = [&](std::vector<std::string> flags, const std::vector<std::string>& more) {
    flags.insert(flags.end(), more.begin(), more.end());
    return flags;
  };
  expect_failure_mentioning(fit({"--weight-decay", "0.2"}),
                            {"--model mlp does not use --weight-decay"});
  expect_failure_mentioning(run_command(pipetrain_command({"fit", "--model", "llama"},
                                                          with(tiny_llama, {"--dropout", "0.1"}))),
                            {"--model llama does not use --dropout"});
  expect_failure_mentioning(
      run_command(pipetrain_command({"fit", "--model", "gpt2"}, with(tiny, {"--n-kv-head", "1"}))),
      {"--model gpt2 does not use --n-kv-head"});
  // A decay's flags under the constant schedule (no --lr-schedule) would train at --lr.
  expect_failure_mentioning(
      run_command(pipetrain_command({"fit", "--model", "gpt2"}, with(tiny, {"--min-lr", "1e-5"}))),
      {"--min-lr and --decay-steps shape a decaying schedule, and --lr-schedule is constant"});
  expect_failure_mentioning(
      run_command(pipetrain_command({"fit", "--model", "llama"},
                                    with(tiny_llama, {"--vocab-size", "70000"}))),
      {dir + "/train.bin holds 16-bit tokens", "vocabulary of 70000", "--token-dtype uint32"});
  expect_failure_mentioning(
      run_command(pipetrain_command({"fit", "--model", "llama"},
                                    with(tiny_llama, {"--block-size", "9000"}))),
      {"--block-size 9000", "max_position_embeddings 8192"});
}

// --max-memory (bytes, with the units CLI11 reads) is held against every rank's weights, gradients
// and optimizer state before any step, and against what the first step measured before its
// optimizer step: either way nothing is trained. The MLP's weights are 0.4 MiB, Adam's state twice
// that; a batch of 512 rows keeps several MiB of activations.
TEST(BadInput, MaxMemoryBelowWhatARankNeeds) {
  const auto before = fit({"--strategy", "pipe", "--devices", "2", "--max-memory", "256KiB"});
  expect_failure_mentioning(before, {"needs", "before any activation",
                                     "more than max_memory (--max-memory) 0.2 MiB; nothing was "
                                     "trained",
                                     "--devices under pipe"});
  EXPECT_EQ(before.exit_code, 2) << before.output;
  EXPECT_EQ(before.output.find("memory per rank after the first step"), std::string::npos);

  const auto after = fit({"--batch-size", "512", "--max-memory", "2MiB"});
  expect_failure_mentioning(after, {"memory per rank after the first step",
                                    "the first step's activations, gradients and workspace at "
                                    "their peak",
                                    "more than max_memory (--max-memory) 2.0 MiB; nothing was "
                                    "trained",
                                    "--checkpoint always"});
  EXPECT_EQ(after.output.find("trained 1 steps"), std::string::npos) << after.output;

  const auto enough = fit({"--batch-size", "512", "--max-memory", "1GiB"});
  EXPECT_EQ(enough.exit_code, 0) << enough.output;
  EXPECT_NE(enough.output.find("peak memory per rank, MiB: 0: "), std::string::npos)
      << enough.output;
}

// What cannot be split or scheduled as asked is refused by the launcher before any rank starts,
// said once (each rank would say it, after all of them had started: a thousand for --devices
// 1000).
TEST(BadInput, APipelineThatCannotBeBuiltIsRefusedBeforeAnyRankStarts) {
  const auto too_many = fit({"--model", "boring", "--strategy", "pipe", "--devices", "4"});
  expect_failure_mentioning(too_many, {"pipetrain: error: --model boring has 3 layers, and 4 "
                                       "stages were asked for (--devices x --num-nodes)"});
  EXPECT_EQ(too_many.exit_code, 2);
  EXPECT_EQ(too_many.output.find("rank"), std::string::npos) << too_many.output;

  const std::string dir = make_temp_dir("bad-pipeline-files");
  std::ofstream(dir + "/plan.json") << "garbage";
  std::ofstream(dir + "/schedule.csv") << "0F0,zz\n";
  for (const auto& [flags, expected] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--plan", dir + "/plan.json"}, dir + "/plan.json is not a plan pipetrain wrote"},
           {{"--plan", dir}, "--plan " + dir + " is a folder: give the plan.json in it"},
           {{"--schedule-file", dir + "/schedule.csv"}, "cannot read the action 'zz'"}}) {
    auto all = flags;
    all.insert(all.end(), {"--strategy", "pipe", "--devices", "2"});
    const auto result = fit(all);
    expect_failure_mentioning(result, {expected});
    EXPECT_EQ(result.exit_code, 2);
    const auto first = result.output.find(expected);
    EXPECT_EQ(result.output.find(expected, first + 1), std::string::npos)
        << "said more than once:\n"
        << result.output;
  }
  fs::remove_all(dir);
}

// pipetrain plan checks the counts fit checks.
TEST(BadInput, PlanCountsOutOfRange) {
  for (const auto& [flags, expected] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--devices", "0"}, "devices (--devices) must be at least 1 (got 0)"},
           {{"--num-nodes", "0"}, "num_nodes (--num-nodes) must be at least 1 (got 0)"},
           {{"--stages", "-1"}, "stages (--stages) must be at least 0 (got -1)"}}) {
    auto argv = pipetrain_command({"plan", "--model", "mlp"}, flags);
    const auto result = run_command(argv, {}, kLimit);
    expect_failure_mentioning(result, {expected});
    EXPECT_EQ(result.exit_code, 2) << result.output;
  }
}

// A file the user hands in that is not there, or not readable as what it should be, is the same
// usage error (2).
TEST(BadInput, AMissingCorpusIsAUsageError) {
  const auto result = fit({"--model", "gpt", "--corpus", "/nonexistent/corpus.txt"});
  expect_failure_mentioning(result, {"cannot read corpus file '/nonexistent/corpus.txt'"});
  EXPECT_EQ(result.exit_code, 2);
}

TEST(BadInput, BalanceSummingToTheWrongLength) {
  expect_failure_mentioning(fit({"--strategy", "pipe", "--devices", "2", "--balance", "3,3"}),
                            {"balance 3,3 sums to 6", "15 layers"});
}

TEST(BadInput, BalanceWithAZeroOrNegativeEntry) {
  expect_failure_mentioning(fit({"--strategy", "pipe", "--devices", "2", "--balance", "0,15"}),
                            {"stage 0 0 layers"});
  expect_failure_mentioning(fit({"--strategy", "pipe", "--devices", "2", "--balance=-1,16"}),
                            {"stage 0 -1 layers"});
}

TEST(BadInput, DevicesDisagreeingWithTheBalance) {
  expect_failure_mentioning(fit({"--strategy", "pipe", "--devices", "3", "--balance", "7,8"}),
                            {"devices (3) disagrees with balance 7,8"});
}

TEST(BadInput, ChunksLargerThanTheBatch) {
  expect_failure_mentioning(
      fit({"--strategy", "pipe", "--devices", "2", "--chunks", "8", "--batch-size", "4"}),
      {"chunks (8) is larger than the batch size (4)"});
}

TEST(BadInput, UnknownStrategyListsTheRegisteredOnes) {
  expect_failure_mentioning(fit({"--strategy", "dpp"}),
                            {"unknown strategy 'dpp'", "pipe", "single"});
}

TEST(BadInput, UnknownCheckpointMode) {
  expect_failure_mentioning(fit({"--strategy", "pipe", "--checkpoint", "sometimes"}),
                            {"unknown checkpoint mode 'sometimes'", "except_last"});
}

TEST(BadInput, UnknownSchedule) {
  expect_failure_mentioning(fit({"--strategy", "pipe", "--schedule", "zigzag"}),
                            {"zigzag", "gpipe", "1f1b"});
}

TEST(BadInput, ChunksUnderAStrategyThatRunsWholeBatches) {
  for (const std::string strategy : {"single", "ddp"}) {
    const auto result = fit({"--strategy", strategy, "--chunks", "4"});
    expect_failure_mentioning(result, {"strategy '" + strategy + "' runs each batch whole",
                                       "PipeOptions::chunks (--chunks) 4"});
    EXPECT_EQ(result.exit_code, 2);
  }
}

TEST(BadInput, SingleOnTwoDevices) {
  expect_failure_mentioning(fit({"--strategy", "single", "--devices", "2"}),
                            {"strategy 'single' runs on one device"});
}

TEST(BadInput, UnknownAcceleratorAndCudaWithoutAGpu) {
  expect_failure_mentioning(fit({"--accelerator", "tpu"}), {"unknown accelerator 'tpu'"});
  if (torch::cuda::is_available()) GTEST_SKIP() << "this machine has a GPU";
  expect_failure_mentioning(fit({"--accelerator", "cuda"}), {"no GPU is visible"});
}

TEST(BadInput, NodeRankMissingForSeveralNodes) {
  expect_failure_mentioning(fit({"--strategy", "ddp", "--devices", "2", "--num-nodes", "2"}),
                            {"NODE_RANK"});
}

// Stage 0 ends in Linear(4, 8) but stage 1 starts with Linear(16, 2).
PIPETRAIN_WORKER(mismatched_stages) {
  auto world = World::connect(*select_cluster_environment(), std::chrono::seconds(30));
  torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::Linear(16, 2));
  Pipe pipe(model, PipeOptions().balance({1, 1}).chunks(2), world);
  pipe.forward_backward(torch::randn({6, 4}), 6,
                        [](const at::Tensor& out, const MicroBatch&) { return out.sum(); });
}

TEST(BadInput, StageOutputTheNextStageCannotTake) {
  const auto result = run_command({"/proc/self/exe"},
                                  {{"PIPETRAIN_TEST_WORKER", "launch_mismatched_stages"}}, kLimit);
  expect_failure_mentioning(result, {"stage 1", "[3, 8]", "from stage 0", "--balance"});
}

PIPETRAIN_WORKER(launch_mismatched_stages) { std::exit(run_ranks(2, "mismatched_stages")); }

// Rank 0 of a manual launch whose rank 1 never starts: within --timeout it names who is missing.
TEST(BadInput, ARankThatNeverArrivesIsNamedWithinTheTimeout) {
  std::map<std::string, std::string> env{{"MASTER_ADDR", "127.0.0.1"},
                                         {"MASTER_PORT", std::to_string(find_free_port())},
                                         {"WORLD_SIZE", "2"},
                                         {"RANK", "0"},
                                         {"LOCAL_RANK", "0"}};
  const auto result =
      run_command({PIPETRAIN_CLI, "fit", "--model", "mlp", "--strategy", "pipe", "--devices", "2",
                   "--timeout", "3", "--default-root-dir", make_temp_dir("missing-rank")},
                  env, kLimit);
  expect_failure_mentioning(result, {"only ranks 0 of 2 reached the rendezvous at 127.0.0.1",
                                     "within 3 s (--timeout); ranks 1 did not"});
  EXPECT_LT(result.seconds, 20) << result.output;
}

// Two ranks started as torchrun would start them; rank 1 is killed mid-run.
TEST(BadInput, PeerKilledMidStep) {
  const auto root = make_temp_dir("killed-peer");
  const auto argv = pipetrain_command({"fit", "--model", "mlp", "--strategy", "pipe", "--devices",
                                       "2", "--chunks", "4", "--max-epochs", "100000",
                                       "--log-every-n-steps", "1", "--default-root-dir", root});
  std::map<std::string, std::string> env{{"MASTER_ADDR", "127.0.0.1"},
                                         {"MASTER_PORT", std::to_string(find_free_port())},
                                         {"WORLD_SIZE", "2"},
                                         {"OMP_NUM_THREADS", "1"}};
  env["RANK"] = env["LOCAL_RANK"] = "0";
  const auto rank0 = start_command(argv, env);
  env["RANK"] = env["LOCAL_RANK"] = "1";
  const auto rank1 = start_command(argv, env);
  // Whatever happens below, neither rank outlives the test.
  struct Reaper {
    std::vector<int> pids;
    ~Reaper() {
      for (int pid : pids) kill(-pid, SIGKILL);
    }
  } reaper{{rank0.pid, rank1.pid}};

  const auto deadline = std::chrono::steady_clock::now() + kLimit;
  const std::string progress = "Epoch 0: 20/";
  while (read_output(rank0).find(progress) == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_NE(read_output(rank0).find(progress), std::string::npos) << read_output(rank0);
  kill(rank1.pid, SIGKILL);
  wait_command(rank1, kLimit);
  const auto killed_at = std::chrono::steady_clock::now();
  const auto result = wait_command(rank0, kLimit);
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, kLimit);
  // Wherever rank 0 was (receiving, sending, sharing metrics), it names the rank it lost.
  expect_failure_mentioning(result, {"rank 0 could not", "rank 1 may have exited"});
  EXPECT_NE(result.output.find("pipetrain: error: rank 0 could not"), std::string::npos)
      << "the rank named once:\n"
      << result.output;
}

}  // namespace
}  // namespace pipetrain::testing::bad_input_test
