// pipetrain under torchrun's own elastic agent (static rendezvous, what `torchrun
// --nproc_per_node 2` starts): the agent hosts the store on MASTER_PORT and says so with
// TORCHELASTIC_USE_AGENT_STORE=True, so rank 0 must join it instead of listening there. Skipped
// where Python has no torch (Debian: python3-torch).
#include <gtest/gtest.h>

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "pipetrain/launcher.h"
#include "support/command.h"
#include "support/multiprocess.h"

namespace pipetrain::testing::torchrun_test {
namespace {

TEST(Torchrun, PipeUnderTorchrunsAgentTrainsAsSingle) {
  if (run_command({"/usr/bin/python3", "-c", "import torch.distributed.launcher"}).exit_code != 0) {
    GTEST_SKIP() << "no torch for /usr/bin/python3 (Debian: python3-torch)";
  }
  const auto root = make_temp_dir("torchrun");
  const auto single = run_command(mlp_fit_command(root + "/single", {"--strategy", "single"}, 5));
  ASSERT_EQ(single.exit_code, 0) << single.output;
  auto launch = mlp_fit_command(root + "/torchrun",
                                {"--strategy", "pipe", "--devices", "2", "--chunks", "2"}, 5);
  launch.insert(launch.begin(),
                {"/usr/bin/python3", PIPETRAIN_SOURCE_DIR "/tests/cli/torchrun_launch.py",
                 std::to_string(find_free_port())});
  const auto torchrun = run_command(launch, {}, std::chrono::seconds(180));
  ASSERT_EQ(torchrun.exit_code, 0) << torchrun.output;

  ASSERT_EQ(read_csv_column(metrics_csv(root + "/single"), "train_loss").size(), 5u);
  expect_same_train_losses(root + "/single", root + "/torchrun");
  std::filesystem::remove_all(root);
}

// The pid of the process started with `marker` among its arguments and `variable` in its
// environment (-1 if none).
int find_process(const std::string& marker, const std::string& variable) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream cmdline(entry.path() / "cmdline"), environ(entry.path() / "environ");
    const std::string args((std::istreambuf_iterator<char>(cmdline)),
                           std::istreambuf_iterator<char>());
    const std::string env((std::istreambuf_iterator<char>(environ)),
                          std::istreambuf_iterator<char>());
    if (args.find(marker) == std::string::npos) continue;
    if (env.find(std::string(1, '\0') + variable + '\0') != std::string::npos ||
        env.rfind(variable + '\0', 0) == 0) {
      return std::stoi(name);
    }
  }
  return -1;
}

// torchrun --max-restarts 1: rank 1 killed mid-run, the agent restarts both ranks, which resume
// from last.ckpt (--ckpt-path last) and finish; the steps after the restart log what an
// uninterrupted run logs.
TEST(Torchrun, ARestartAfterARankDiesContinuesFromLastCkpt) {
  if (run_command({"/usr/bin/python3", "-c", "import torch.distributed.launcher"}).exit_code != 0) {
    GTEST_SKIP() << "no torch for /usr/bin/python3 (Debian: python3-torch)";
  }
  const auto root = make_temp_dir("torchrun-restart");
  const std::vector<std::string> flags{
      "--strategy", "pipe",     "--devices", "2", "--chunks", "2", "--every-n-train-steps",
      "50",         "--logger", "csv"};
  constexpr int64_t kSteps = 2000;
  const auto straight = run_command(mlp_fit_command(root + "/straight", flags, kSteps));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;

  auto flags_resuming = flags;
  flags_resuming.insert(flags_resuming.end(), {"--ckpt-path", "last"});
  auto launch = mlp_fit_command(root + "/restarted", flags_resuming, kSteps);
  launch.insert(launch.begin(),
                {"/usr/bin/python3", PIPETRAIN_SOURCE_DIR "/tests/cli/torchrun_launch.py",
                 std::to_string(find_free_port())});
  const auto torchrun = start_command(launch, {{"MAX_RESTARTS", "1"}});
  // Once the first attempt has saved a checkpoint or two, rank 1 dies.
  const auto first = root + "/restarted/lightning_logs/version_0/metrics.csv";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline &&
         (!std::filesystem::exists(first) || read_csv_column(first, "train_loss").size() < 100)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int rank1 = find_process(root + "/restarted", "RANK=1");
  ASSERT_GT(rank1, 0) << read_output(torchrun);
  kill(rank1, SIGKILL);
  const auto result = wait_command(torchrun, std::chrono::seconds(300));
  ASSERT_EQ(result.exit_code, 0) << result.output;

  const auto expected = read_csv_column(metrics_csv(root + "/straight"), "train_loss");
  const auto before = read_csv_column(first, "train_loss");
  const auto second = root + "/restarted/lightning_logs/version_1/metrics.csv";
  const auto after = read_csv_column(second, "train_loss");
  const auto steps = read_csv_column(second, "step");
  ASSERT_EQ(expected.size(), static_cast<size_t>(kSteps));
  ASSERT_FALSE(after.empty());
  ASSERT_LT(before.size(), static_cast<size_t>(kSteps)) << "rank 1 was killed after the end";
  // The restart went back to a checkpoint, every 50 steps, and trained on to the end.
  const auto resumed_at = static_cast<size_t>(steps.front());
  EXPECT_EQ(resumed_at % 50, 0u);
  EXPECT_GE(resumed_at, 50u);
  EXPECT_EQ(resumed_at + after.size(), static_cast<size_t>(kSteps));
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i], expected[resumed_at + i]) << "step " << resumed_at + i;
  }
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace pipetrain::testing::torchrun_test
