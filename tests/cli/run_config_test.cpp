// The config.json fit keeps beside a run's checkpoints says the model they hold: what reads a
// checkpoint back (a resume, validate, test, predict, export) builds that model, and a flag that
// contradicts it is refused naming the key, even where the tensors would fit (4 query and 2
// key-value heads of width 4 are as large as 2 and 1 of width 8).
#include <gtest/gtest.h>

#include <filesystem>

#include "support/command.h"
#include "support/multiprocess.h"

namespace pipetrain::testing::run_config_test {
namespace {

namespace fs = std::filesystem;

// One step of a tiny Llama fit into `dir`/run, on byte tokens of a license text.
class RunConfig : public LicenseTokensTest {
 protected:
  void SetUp() override {
    LicenseTokensTest::SetUp();
    run_ok(command("fit", {"--model", "llama", "--n-layer", "1", "--n-embd", "16", "--n-head", "2",
                           "--n-kv-head", "1", "--intermediate-size", "32", "--vocab-size", "256",
                           "--rope-theta", "12345", "--max-steps", "1"}));
  }
  // `subcommand` of the run under dir/run, then `flags`.
  std::vector<std::string> command(const std::string& subcommand,
                                   const std::vector<std::string>& flags) const {
    return pipetrain_command({subcommand,
                              "--train-data",
                              dir + "/data/train.bin",
                              "--block-size",
                              "8",
                              "--batch-size",
                              "4",
                              "--limit-val-batches",
                              "1",
                              "--num-sanity-val-steps",
                              "0",
                              "--enable-progress-bar",
                              "false",
                              "--logger",
                              "csv",
                              "--limit-test-batches",
                              "1",
                              "--limit-predict-batches",
                              "1",
                              "--default-root-dir",
                              dir + "/run"},
                             flags);
  }
};

void expect_refused(const CommandResult& result, const std::vector<std::string>& parts) {
  EXPECT_EQ(result.exit_code, 2) << result.output;
  for (const auto& part : parts) {
    EXPECT_NE(result.output.find(part), std::string::npos) << "expected '" << part << "' in:\n"
                                                           << result.output;
  }
}

TEST_F(RunConfig, AResumeOfAnotherShapeIsRefusedNamingTheKey) {
  const std::vector<std::string> resume{"--model", "llama",       "--ckpt-path",
                                        "last",    "--max-steps", "2"};
  auto with = [&](std::vector<std::string> flags) {
    flags.insert(flags.begin(), resume.begin(), resume.end());
    return run_command(command("fit", flags));
  };
  expect_refused(with({"--n-layer", "1", "--n-embd", "16", "--n-head", "4", "--n-kv-head", "2",
                       "--intermediate-size", "32", "--vocab-size", "256"}),
                 {"/run/lightning_logs/version_0/config.json) has num_attention_heads 2, and "
                  "--n-head says 4"});
  expect_refused(with({"--rope-theta", "10000"}), {"has rope_theta 12345.0, and --rope-theta"});
  expect_refused(with({"--rms-norm-eps", "0.001"}), {"rms_norm_eps", "--rms-norm-eps says 0.001"});
  expect_refused(with({"--model-size", "llama-150m"}),
                 {"has num_hidden_layers 1, and --model-size llama-150m says"});
  // No other run was started for them.
  EXPECT_FALSE(fs::exists(dir + "/run/lightning_logs/version_1"));
  // Without shape flags the resume takes the run's shape, and trains on from the checkpoint.
  const auto resumed = run_command(command("fit", resume));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
}

// validate, test, predict and export of a checkpoint need neither --model nor the shape flags; a
// --model of another family is refused.
TEST_F(RunConfig, WhatReadsACheckpointTakesTheModelFromItsRun) {
  for (const std::string subcommand : {"validate", "test", "predict"}) {
    const auto result = run_command(command(subcommand, {"--ckpt-path", "last"}));
    EXPECT_EQ(result.exit_code, 0) << subcommand << ":\n" << result.output;
  }
  const auto exported =
      run_command(pipetrain_command({"export", "--ckpt-path", "last", "--default-root-dir",
                                     dir + "/run", "--output", dir + "/hf"}));
  EXPECT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_TRUE(fs::exists(dir + "/hf/model.safetensors"));
  expect_refused(run_command(command("validate", {"--model", "gpt2", "--ckpt-path", "last"})),
                 {"--model gpt2: ", "last.ckpt is of a llama (model_type in ",
                  "pass --model llama, or leave --model out"});
}

}  // namespace
}  // namespace pipetrain::testing::run_config_test
