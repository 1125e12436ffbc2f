// Running the `pipetrain` command (or any other) from a test and reading what it printed.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

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

// Column `name` of a Lightning metrics.csv, in row order (rows without a value are skipped).
std::vector<double> read_csv_column(const std::string& path, const std::string& name);

}  // namespace pipetrain::testing
