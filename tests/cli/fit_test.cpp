// The `pipetrain fit` contract, run as a user runs it.
#include <gtest/gtest.h>

#include <filesystem>

#include "support/command.h"
#include "support/multiprocess.h"

namespace pipetrain::testing {
namespace {

std::vector<std::string> fit_command(const std::string& root, std::vector<std::string> extra) {
  std::vector<std::string> argv{
      PIPETRAIN_CLI,         "fit", "--model", "mlp", "--max-steps",        "12",
      "--batch-size",        "24",  "--seed",  "3",   "--default-root-dir", root,
      "--log-every-n-steps", "1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

std::string metrics_csv(const std::string& root) {
  return root + "/lightning_logs/version_0/metrics.csv";
}

TEST(FitCommand, PipeOnTwoDevicesLogsTheSameLossesAsSingle) {
  const auto root = make_temp_dir("fit-cli");
  const auto single = run_command(fit_command(root + "/single", {"--strategy", "single"}));
  ASSERT_EQ(single.exit_code, 0) << single.output;
  const auto pipe = run_command(
      fit_command(root + "/pipe", {"--strategy", "pipe", "--devices", "2", "--chunks", "3",
                                   "--schedule", "1f1b", "--checkpoint", "always"}));
  ASSERT_EQ(pipe.exit_code, 0) << pipe.output;

  const auto expected = read_csv_column(metrics_csv(root + "/single"), "train_loss");
  const auto actual = read_csv_column(metrics_csv(root + "/pipe"), "train_loss");
  ASSERT_EQ(expected.size(), 12u);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 1e-5 * std::abs(expected[i])) << "step " << i;
  }
  EXPECT_EQ(read_csv_column(metrics_csv(root + "/pipe"), "step").back(), 11);
  EXPECT_NE(pipe.output.find("lightning_logs/version_0"), std::string::npos) << pipe.output;
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
}  // namespace pipetrain::testing
