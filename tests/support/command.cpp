#include "support/command.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "support/multiprocess.h"

namespace pipetrain::testing {

RunningCommand start_command(const std::vector<std::string>& argv,
                             const std::map<std::string, std::string>& env) {
  RunningCommand command;
  command.output_path = make_temp_dir("pipetrain-command") + "/output.txt";
  command.started = std::chrono::steady_clock::now();
  command.pid = fork();
  if (command.pid < 0) throw std::runtime_error("fork failed");
  if (command.pid == 0) {
    const int fd = open(command.output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    setpgid(0, 0);  // its own process group, so a timeout kills its ranks too
    // The command's tests compare CPU runs of up to 6 processes: on a GPU machine, "auto" would
    // put them on GPUs it may not have. A test (or the caller's environment) can choose otherwise.
    setenv("PIPETRAIN_ACCELERATOR", "cpu", /*overwrite=*/0);
    for (const auto& [key, value] : env) setenv(key.c_str(), value.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  return command;
}

std::string read_output(const RunningCommand& command) {
  std::ifstream in(command.output_path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

CommandResult wait_command(const RunningCommand& command, std::chrono::seconds timeout) {
  int status = 0;
  while (true) {
    const pid_t done = waitpid(command.pid, &status, WNOHANG);
    if (done == command.pid) break;
    if (std::chrono::steady_clock::now() - command.started > timeout) {
      kill(-command.pid, SIGKILL);
      waitpid(command.pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CommandResult result;
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - command.started).count();
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.output = read_output(command);
  return result;
}

CommandResult run_command(const std::vector<std::string>& argv,
                          const std::map<std::string, std::string>& env,
                          std::chrono::seconds timeout) {
  return wait_command(start_command(argv, env), timeout);
}

CommandResult run_ok(const std::vector<std::string>& argv) {
  auto result = run_command(argv);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  return result;
}

std::vector<double> train_losses_in(const std::vector<std::string>& paths) {
  std::vector<double> losses;
  for (const auto& path : paths) {
    const auto part = read_csv_column(path, "train_loss");
    losses.insert(losses.end(), part.begin(), part.end());
  }
  return losses;
}

std::vector<double> read_csv_column(const std::string& path, const std::string& name) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::string line;
  std::getline(in, line);
  int column = -1;
  {
    std::stringstream header(line);
    std::string cell;
    for (int i = 0; std::getline(header, cell, ','); ++i) {
      if (cell == name) column = i;
    }
  }
  if (column < 0) throw std::runtime_error("no column " + name + " in " + path);
  std::vector<double> values;
  while (std::getline(in, line)) {
    std::stringstream row(line);
    std::string cell;
    for (int i = 0; std::getline(row, cell, ','); ++i) {
      if (i == column && !cell.empty()) values.push_back(std::stod(cell));
    }
  }
  return values;
}

std::string metrics_csv(const std::string& root, int version) {
  return root + "/lightning_logs/version_" + std::to_string(version) + "/metrics.csv";
}

void expect_same_train_losses(const std::string& expected_root, const std::string& actual_root,
                              double relative) {
  const auto expected = read_csv_column(metrics_csv(expected_root), "train_loss");
  const auto actual = read_csv_column(metrics_csv(actual_root), "train_loss");
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], relative * std::abs(expected[i])) << "step " << i;
  }
}

}  // namespace pipetrain::testing
