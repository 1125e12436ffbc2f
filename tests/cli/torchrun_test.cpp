// pipetrain under torchrun's own elastic agent (static rendezvous, what `torchrun
// --nproc_per_node 2` starts): the agent hosts the store on MASTER_PORT and says so with
// TORCHELASTIC_USE_AGENT_STORE=True, so rank 0 must join it instead of listening there. Skipped
// where Python has no torch (Debian: python3-torch).
#include <gtest/gtest.h>

#include <filesystem>

#include "pipetrain/launcher.h"
#include "support/command.h"
#include "support/multiprocess.h"

namespace pipetrain::testing {
namespace {

std::vector<std::string> fit(const std::string& root, std::vector<std::string> extra) {
  std::vector<std::string> argv{
      PIPETRAIN_CLI,         "fit", "--model", "mlp", "--max-steps",        "5",
      "--batch-size",        "24",  "--seed",  "3",   "--default-root-dir", root,
      "--log-every-n-steps", "1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

TEST(Torchrun, PipeUnderTorchrunsAgentTrainsAsSingle) {
  if (run_command({"/usr/bin/python3", "-c", "import torch.distributed.launcher"}).exit_code != 0) {
    GTEST_SKIP() << "no torch for /usr/bin/python3 (Debian: python3-torch)";
  }
  const auto root = make_temp_dir("torchrun");
  const auto single = run_command(fit(root + "/single", {"--strategy", "single"}));
  ASSERT_EQ(single.exit_code, 0) << single.output;
  auto launch = fit(root + "/torchrun", {"--strategy", "pipe", "--devices", "2", "--chunks", "2"});
  launch.insert(launch.begin(),
                {"/usr/bin/python3", PIPETRAIN_SOURCE_DIR "/tests/cli/torchrun_launch.py",
                 std::to_string(find_free_port())});
  const auto torchrun = run_command(launch, {}, std::chrono::seconds(180));
  ASSERT_EQ(torchrun.exit_code, 0) << torchrun.output;

  const auto csv = [](const std::string& run) {
    return read_csv_column(run + "/lightning_logs/version_0/metrics.csv", "train_loss");
  };
  const auto expected = csv(root + "/single");
  const auto actual = csv(root + "/torchrun");
  ASSERT_EQ(expected.size(), 5u);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 1e-5 * std::abs(expected[i])) << "step " << i;
  }
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace pipetrain::testing
