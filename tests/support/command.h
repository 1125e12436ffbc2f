// Running the `pipetrain` command (or any other) from a test and reading what it printed.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "support/multiprocess.h"
#include "support/temp_dir.h"

namespace pipetrain::testing {

struct CommandResult {
  int exit_code = -1;  // 128 + signal when killed
  std::string output;  // stdout and stderr together
  double seconds = 0;  // wall time
};

// A command started in the background, its output going to a file.
struct RunningCommand {
  int pid = -1;
  std::string output_path;
  std::chrono::steady_clock::time_point started;
};

RunningCommand start_command(const std::vector<std::string>& argv,
                             const std::map<std::string, std::string>& env = {});
// Waits for it; kills its process group after `timeout` (exit code 137).
CommandResult wait_command(const RunningCommand& command, std::chrono::seconds timeout);
// What it has printed so far.
std::string read_output(const RunningCommand& command);

// Runs `argv` with `env` added to the environment; kills it after `timeout` (exit code 137).
CommandResult run_command(const std::vector<std::string>& argv,
                          const std::map<std::string, std::string>& env = {},
                          std::chrono::seconds timeout = std::chrono::seconds(120));

// run_command that expects the command to succeed: a non-zero exit fails the test, with its output.
CommandResult run_ok(const std::vector<std::string>& argv);

// Column `name` of a Lightning metrics.csv, in row order (rows without a value are skipped).
std::vector<double> read_csv_column(const std::string& path, const std::string& name);

// The train_loss column of each metrics.csv of `paths`, one after the other: the losses of a fit
// logged in parts (stopped, then resumed).
std::vector<double> train_losses_in(const std::vector<std::string>& paths);

#ifdef PIPETRAIN_CLI
// The pipetrain CLI's command line: `args` (a subcommand and its flags), then `extra`, a test's own
// flags. (Inline, as are the commands below: PIPETRAIN_CLI is defined for the test executables
// alone.)
inline std::vector<std::string> pipetrain_command(std::vector<std::string> args,
                                                  const std::vector<std::string>& extra = {}) {
  args.insert(args.begin(), PIPETRAIN_CLI);
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// `pipetrain prepare-data` of a license text every Debian system has into `output` (train.bin and
// val.bin of byte tokens); a failure fails the test.
inline CommandResult prepare_license_tokens(const std::string& output) {
  return run_ok(pipetrain_command(
      {"prepare-data", "--input", "/usr/share/common-licenses/GPL-3", "--output", output}));
}

// A test whose folder's data/ holds the license text's byte tokens (prepare_license_tokens), made
// before the test runs.
class LicenseTokensTest : public TempDirTest {
 protected:
  void SetUp() override {
    const auto prepared = prepare_license_tokens(dir + "/data");
    EXPECT_NE(prepared.output.find("wrote "), std::string::npos) << prepared.output;
  }
};

// `pipetrain SUBCOMMAND --model MODEL` into `root`, logging every step to CSV, with no sanity
// validation and `val_batches` validation batches, then `extra` (seed, batch size, steps...).
inline std::vector<std::string> csv_logged_command(const std::string& subcommand,
                                                   const std::string& model,
                                                   const std::string& root, int64_t val_batches,
                                                   const std::vector<std::string>& extra) {
  return pipetrain_command({subcommand, "--model", model, "--default-root-dir", root,
                            "--log-every-n-steps", "1", "--num-sanity-val-steps", "0",
                            "--limit-val-batches", std::to_string(val_batches), "--logger", "csv"},
                           extra);
}

// `pipetrain fit` of the built-in MLP (batch 24, seed 3, a loss logged every step) into `root`,
// with `extra` flags.
inline std::vector<std::string> mlp_fit_command(const std::string& root,
                                                const std::vector<std::string>& extra,
                                                int64_t max_steps = 12) {
  return pipetrain_command(
      {"fit", "--model", "mlp", "--max-steps", std::to_string(max_steps), "--batch-size", "24",
       "--seed", "3", "--default-root-dir", root, "--log-every-n-steps", "1"},
      extra);
}

// The shape of a Llama of 2 layers, width 16, 2 query heads sharing 1 key-value head and an MLP
// of 32, for `vocab_size` tokens in windows of `block_size`: --model llama's flags.
inline std::vector<std::string> tiny_llama_flags(int64_t vocab_size, int64_t block_size) {
  return {"--n-layer",
          "2",
          "--n-embd",
          "16",
          "--n-head",
          "2",
          "--n-kv-head",
          "1",
          "--intermediate-size",
          "32",
          "--vocab-size",
          std::to_string(vocab_size),
          "--block-size",
          std::to_string(block_size)};
}

// `pipetrain fit` of a GPT-2 of 2 layers, 2 heads, width 16 on 8-token windows of byte tokens
// (`train_bin`, as prepare-data writes), batch 4, logging to CSV under `root`, with `extra` flags.
inline std::vector<std::string> tiny_gpt2_fit_command(const std::string& root,
                                                      const std::string& train_bin,
                                                      std::vector<std::string> extra) {
  std::vector<std::string> argv{PIPETRAIN_CLI,
                                "fit",
                                "--model",
                                "gpt2",
                                "--n-layer",
                                "2",
                                "--n-head",
                                "2",
                                "--n-embd",
                                "16",
                                "--block-size",
                                "8",
                                "--vocab-size",
                                "256",
                                "--train-data",
                                train_bin,
                                "--batch-size",
                                "4",
                                "--logger",
                                "csv",
                                "--enable-progress-bar",
                                "false",
                                "--default-root-dir",
                                root};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}
#endif

// Where run `version` (the first by default) under `root` logged its metrics.
std::string metrics_csv(const std::string& root, int version = 0);
// The runs under `expected_root` and `actual_root` logged as many train losses, equal to a
// relative 1e-5 (gtest expectations).
void expect_same_train_losses(const std::string& expected_root, const std::string& actual_root,
                              double relative = 1e-5);

}  // namespace pipetrain::testing
