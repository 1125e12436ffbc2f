// The command's conventions as scripts meet them: a flag given again overrides the earlier value
// (a shared list of flags, then a script's own), and every subcommand that reads a checkpoint
// takes `--ckpt-path last` and `best` under `--default-root-dir`, export included.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "support/command.h"
#include "support/multiprocess.h"

namespace pipetrain::testing::cli_conventions_test {
namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<std::string> concat(std::vector<std::string> first,
                                const std::vector<std::string>& second) {
  first.insert(first.end(), second.begin(), second.end());
  return first;
}

std::string checkpoints(const std::string& root) {
  return root + "/lightning_logs/version_0/checkpoints";
}

// Checkpoint flags that leave exactly one top-k file, from step 1, and last.ckpt from the last
// step: every step is a candidate, and the smallest step the best.
const std::vector<std::string> kBestIsStepOne{
    "--every-n-train-steps", "1", "--monitor", "step", "--mode", "min"};

// `pipetrain SUBCOMMAND` of the BoringModel, 8 steps an epoch, each changing its validation loss
// visibly; no logs or progress bar, two validation batches; then `flags`.
std::vector<std::string> boring(const std::string& subcommand, std::vector<std::string> flags) {
  flags.insert(flags.begin(), {"--enable-progress-bar", "false", "--limit-val-batches", "2"});
  return pipetrain_command(
      {subcommand, "--model", "boring", "--batch-size", "8", "--lr", "0.1", "--logger", "none"},
      flags);
}

TEST(CliConventions, AFlagGivenAgainTakesItsLastValueInEverySubcommand) {
  const auto root = make_temp_dir("cli-conventions");
  // A script's shared flags, then its own.
  const auto common = mlp_fit_command(
      root, {"--devices", "2", "--logger", "csv,tensorboard", "--enable-progress-bar", "false"},
      /*max_steps=*/5);
  // One device: strategy single refuses two.
  run_ok(concat(common, {"--devices", "1", "--max-steps", "2", "--logger", "csv"}));
  const auto run = root + "/lightning_logs/version_0";
  EXPECT_NE(read_file(run + "/hparams.yaml").find("devices: 1\n"), std::string::npos)
      << read_file(run + "/hparams.yaml");
  EXPECT_EQ(read_csv_column(run + "/metrics.csv", "train_loss").size(), 2u);
  // A list is replaced as a whole: csv alone.
  for (const auto& entry : fs::directory_iterator(run)) {
    EXPECT_EQ(entry.path().filename().string().rfind("events.out.tfevents", 0), std::string::npos)
        << entry.path();
  }

  run_ok(pipetrain_command({"prepare-data", "--input", "/usr/share/common-licenses/GPL-3",
                            "--output", root + "/first", "--output", root + "/second"}));
  EXPECT_TRUE(fs::exists(root + "/second/train.bin"));
  EXPECT_FALSE(fs::exists(root + "/first"));
  fs::remove_all(root);
}

TEST(CliConventions, ExportReadsLastAndBestAsFitDoes) {
  const auto root = make_temp_dir("cli-conventions");
  prepare_license_tokens(root + "/data");
  const auto run = root + "/run";
  run_ok(tiny_gpt2_fit_command(run, root + "/data/train.bin",
                               concat({"--max-steps", "3", "--num-sanity-val-steps", "0",
                                       "--limit-val-batches", "0", "--logger", "none"},
                                      kBestIsStepOne)));
  // The weights export writes from `ckpt_path`.
  auto exported = [&](const std::string& ckpt_path, const std::string& name) {
    const auto output = root + "/" + name;
    run_ok(pipetrain_command({"export", "--ckpt-path", ckpt_path, "--default-root-dir", run,
                              "--output", output, "--n-head", "2"}));
    return read_file(output + "/model.safetensors");
  };
  const auto last = exported("last", "last");
  ASSERT_FALSE(last.empty());
  EXPECT_EQ(last, exported(checkpoints(run) + "/last.ckpt", "last-path"));
  const auto best = exported("best", "best");
  EXPECT_EQ(best, exported(checkpoints(run) + "/epoch=0-step=1.ckpt", "best-path"));
  EXPECT_NE(best, last);
  fs::remove_all(root);
}

TEST(CliConventions, BestIsTheCheckpointTheCallbackRecordedAlsoAfterTheRunMoved) {
  const auto root = make_temp_dir("cli-conventions");
  const auto run = root + "/run";
  run_ok(boring(
      "fit", concat({"--max-steps", "3", "--num-sanity-val-steps", "0", "--default-root-dir", run},
                    kBestIsStepOne)));
  // The metrics `validate` prints for `ckpt_path` under `root_dir`.
  auto validated = [&](const std::string& ckpt_path, const std::string& root_dir) {
    const auto result =
        run_ok(boring("validate", {"--ckpt-path", ckpt_path, "--default-root-dir", root_dir}));
    const auto line = result.output.find("validate:");
    return line == std::string::npos
               ? result.output
               : result.output.substr(line, result.output.find('\n', line) - line);
  };
  const auto best = validated("best", run);
  EXPECT_EQ(best, validated(checkpoints(run) + "/epoch=0-step=1.ckpt", run));
  EXPECT_NE(best, validated("last", run));

  // Moved elsewhere, the run's best file is found beside its last.ckpt.
  fs::rename(run, root + "/moved");
  EXPECT_EQ(validated("best", root + "/moved"), best);
  fs::remove_all(root);
}

TEST(CliConventions, AMissingLastOrBestSaysWhatToDo) {
  const auto root = make_temp_dir("cli-conventions");
  auto expect_error = [](const CommandResult& result, const std::string& message) {
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find(message), std::string::npos) << result.output;
  };
  expect_error(run_command(pipetrain_command({"export", "--ckpt-path", "last", "--default-root-dir",
                                              root + "/empty", "--output", root + "/hf"})),
               "--ckpt-path last: no last.ckpt under " + root + "/empty/lightning_logs");
  expect_error(run_command(boring("validate",
                                  {"--ckpt-path", "best", "--default-root-dir", root + "/empty"})),
               "--ckpt-path best: the best checkpoint is recorded in last.ckpt, and there is none "
               "under " +
                   root + "/empty/lightning_logs");
  // No top-k file, only last.ckpt.
  run_ok(boring("fit",
                {"--max-steps", "2", "--save-top-k", "0", "--default-root-dir", root + "/run"}));
  expect_error(
      run_command(boring("validate", {"--ckpt-path", "best", "--default-root-dir", root + "/run"})),
      "has saved no best checkpoint");
  fs::remove_all(root);
}

}  // namespace
}  // namespace pipetrain::testing::cli_conventions_test
