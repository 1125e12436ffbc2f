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

}  // namespace
}  // namespace pipetrain::testing
