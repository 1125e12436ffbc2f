// Runs real child processes (/bin/sh scripts, and this test binary itself) through the local
// launcher, because the properties that matter (each rank sees its own variables, one failure
// stops the rest quickly, nothing hangs) only show up with real fork/exec/signals.
#include "pipetrain/launcher.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace pipetrain {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr char kChildDirVariable[] = "PIPETRAIN_LAUNCHER_TEST_CHILD_DIR";

std::string read_file(const fs::path& path) {
  std::ifstream file(path);
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

// The DefaultArgvRerunsThisBinary test launches this very binary. Its children record their
// command line and rank here, during static initialisation, and exit before any test runs (a
// child running the tests would launch children of its own).
const bool kRanAsLaunchedChild = [] {
  const char* dir = std::getenv(kChildDirVariable);
  const char* rank = std::getenv("RANK");
  if (dir == nullptr || rank == nullptr) return false;
  std::ofstream(fs::path(dir) / (std::string("cmdline_") + rank))
      << read_file("/proc/self/cmdline");
  std::_Exit(0);
}();

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "pipetrain_launcher_test.XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Sets (or with nullopt unsets) a variable of this process for one test.
class ScopedEnvironmentVariable {
 public:
  ScopedEnvironmentVariable(std::string name, const std::optional<std::string>& value)
      : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) previous_ = old;
    if (value) {
      setenv(name_.c_str(), value->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ~ScopedEnvironmentVariable() {
    if (previous_) {
      setenv(name_.c_str(), previous_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> previous_;
};

LaunchOptions shell_launch(int64_t nprocs, const std::string& script, const TempDir& dir) {
  LaunchOptions options;
  options.nprocs = nprocs;
  options.argv = {"/bin/sh", "-c", script};
  options.extra_env["DIR"] = dir.path().string();
  return options;
}

bool wait_for_file(const fs::path& path, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!fs::exists(path)) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST(LaunchLocalProcessesTest, AllSucceedWithDistinctRanksAndOneRendezvous) {
  TempDir dir;
  LaunchOptions options = shell_launch(
      3,
      "echo \"$RANK $WORLD_SIZE $MASTER_ADDR $MASTER_PORT $LOCAL_RANK $LOCAL_WORLD_SIZE "
      "$GROUP_RANK $EXTRA\" > \"$DIR/rank_$RANK\"",
      dir);
  options.extra_env["EXTRA"] = "extra-value";
  ASSERT_EQ(launch_local_processes(options), 0);

  std::set<int> ranks;
  std::set<int> ports;
  for (int i = 0; i < 3; ++i) {
    std::istringstream line(read_file(dir.path() / ("rank_" + std::to_string(i))));
    int rank = -1, world_size = 0, port = 0, local_rank = -1, local_world_size = 0, group = -1;
    std::string address, extra;
    line >> rank >> world_size >> address >> port >> local_rank >> local_world_size >> group >>
        extra;
    EXPECT_EQ(rank, i);
    EXPECT_EQ(world_size, 3);
    EXPECT_EQ(address, "127.0.0.1");
    EXPECT_EQ(local_rank, i);
    EXPECT_EQ(local_world_size, 3);
    EXPECT_EQ(group, 0);
    EXPECT_EQ(extra, "extra-value");
    EXPECT_GT(port, 0);
    ranks.insert(rank);
    ports.insert(port);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(ports.size(), 1u);
}

TEST(LaunchLocalProcessesTest, FirstFailureStopsTheOthersQuickly) {
  TempDir dir;
  // Rank 1 fails only once rank 0 has installed its SIGTERM trap, so that the trap (and not
  // a SIGTERM that beat it) is what ends rank 0.
  const std::string script = R"(
    if [ "$RANK" = 0 ]; then
      trap 'kill $pid 2>/dev/null; echo stopped > "$DIR/stopped"; exit 143' TERM
      sleep 60 >/dev/null 2>&1 &
      pid=$!
      touch "$DIR/ready"
      wait
      echo finished > "$DIR/finished"
    else
      i=0
      while [ ! -f "$DIR/ready" ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done
      exit 3
    fi)";
  testing::internal::CaptureStderr();
  const auto start = Clock::now();
  const int code = launch_local_processes(shell_launch(2, script, dir));
  const double elapsed = seconds_since(start);
  const std::string err = testing::internal::GetCapturedStderr();

  EXPECT_EQ(code, 3);
  EXPECT_LT(elapsed, 10.0);
  EXPECT_TRUE(fs::exists(dir.path() / "stopped")) << "rank 0 never saw SIGTERM";
  EXPECT_FALSE(fs::exists(dir.path() / "finished"));
  EXPECT_NE(err.find("pipetrain: rank 1 failed with exit code 3; stopping the other 1 rank\n"),
            std::string::npos)
      << err;
}

TEST(LaunchLocalProcessesTest, RankIgnoringSigtermIsKilledAfterGracePeriod) {
  TempDir dir;
  const std::string script = R"(
    if [ "$RANK" = 0 ]; then
      trap '' TERM
      touch "$DIR/ready"
      exec sleep 60
    else
      i=0
      while [ ! -f "$DIR/ready" ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done
      exit 5
    fi)";
  LaunchOptions options = shell_launch(2, script, dir);
  options.grace_period = std::chrono::milliseconds(300);
  testing::internal::CaptureStderr();
  const auto start = Clock::now();
  const int code = launch_local_processes(options);
  const double elapsed = seconds_since(start);
  const std::string err = testing::internal::GetCapturedStderr();

  EXPECT_EQ(code, 5);
  EXPECT_LT(elapsed, 5.0);
  EXPECT_NE(err.find("sending SIGKILL"), std::string::npos) << err;
}

TEST(LaunchLocalProcessesTest, ChildKilledBySignalReturns128PlusSignal) {
  TempDir dir;
  testing::internal::CaptureStderr();
  const int code = launch_local_processes(
      shell_launch(2, "if [ \"$RANK\" = 1 ]; then kill -KILL $$; fi; exit 0", dir));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 128 + SIGKILL);
  EXPECT_NE(err.find("pipetrain: rank 1 was killed by signal SIGKILL"), std::string::npos) << err;
}

TEST(LaunchLocalProcessesTest, FirstFailureWinsOverLaterOnes) {
  TempDir dir;
  // Rank 0 fails after rank 2 has already failed and been reported.
  const std::string script = R"(
    if [ "$RANK" = 2 ]; then exit 7; fi
    trap 'exit 9' TERM
    sleep 5 >/dev/null 2>&1 &
    wait
    exit 9)";
  EXPECT_EQ(launch_local_processes(shell_launch(3, script, dir)), 7);
}

int expected_omp_threads(int64_t nprocs) {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  return std::max<int>(1, CPU_COUNT(&set) / static_cast<int>(nprocs));
}

TEST(LaunchLocalProcessesTest, SetsOmpNumThreadsOnlyWhenAbsent) {
  const std::string script = "echo $OMP_NUM_THREADS > \"$DIR/omp_$RANK\"";
  {
    TempDir dir;
    ScopedEnvironmentVariable unset("OMP_NUM_THREADS", std::nullopt);
    ASSERT_EQ(launch_local_processes(shell_launch(2, script, dir)), 0);
    const std::string expected = std::to_string(expected_omp_threads(2)) + "\n";
    EXPECT_EQ(read_file(dir.path() / "omp_0"), expected);
    EXPECT_EQ(read_file(dir.path() / "omp_1"), expected);
  }
  {
    TempDir dir;
    ScopedEnvironmentVariable set("OMP_NUM_THREADS", std::string("5"));
    ASSERT_EQ(launch_local_processes(shell_launch(2, script, dir)), 0);
    EXPECT_EQ(read_file(dir.path() / "omp_0"), "5\n");
    EXPECT_EQ(read_file(dir.path() / "omp_1"), "5\n");
  }
  {
    TempDir dir;
    ScopedEnvironmentVariable unset("OMP_NUM_THREADS", std::nullopt);
    LaunchOptions options = shell_launch(2, script, dir);
    options.extra_env["OMP_NUM_THREADS"] = "7";
    ASSERT_EQ(launch_local_processes(options), 0);
    EXPECT_EQ(read_file(dir.path() / "omp_1"), "7\n");
  }
}

TEST(LaunchLocalProcessesTest, ForwardsSigtermToChildrenAndRestoresHandlers) {
  TempDir dir;
  const std::string script = R"(
    trap 'kill $pid 2>/dev/null; echo got > "$DIR/term_$RANK"; exit 0' TERM
    sleep 60 >/dev/null 2>&1 &
    pid=$!
    touch "$DIR/ready_$RANK"
    wait)";
  std::thread signaller([&] {
    // The ready files exist only after the launcher installed its handlers, so the signal
    // cannot hit this test process's default SIGTERM action.
    if (wait_for_file(dir.path() / "ready_0", std::chrono::seconds(10)) &&
        wait_for_file(dir.path() / "ready_1", std::chrono::seconds(10))) {
      kill(getpid(), SIGTERM);
    }
  });
  testing::internal::CaptureStderr();
  const auto start = Clock::now();
  const int code = launch_local_processes(shell_launch(2, script, dir));
  const double elapsed = seconds_since(start);
  const std::string err = testing::internal::GetCapturedStderr();
  signaller.join();

  // The children exited 0 after the forwarded signal, yet the run was interrupted.
  EXPECT_EQ(code, 128 + SIGTERM);
  EXPECT_LT(elapsed, 10.0);
  EXPECT_TRUE(fs::exists(dir.path() / "term_0"));
  EXPECT_TRUE(fs::exists(dir.path() / "term_1"));
  EXPECT_NE(err.find("received SIGTERM"), std::string::npos) << err;

  struct sigaction current {};
  sigaction(SIGTERM, nullptr, &current);
  EXPECT_EQ(current.sa_handler, SIG_DFL);
}

TEST(LaunchLocalProcessesTest, DefaultArgvRerunsThisBinary) {
  TempDir dir;
  LaunchOptions options;
  options.nprocs = 2;
  options.extra_env[kChildDirVariable] = dir.path().string();
  ASSERT_EQ(launch_local_processes(options), 0);
  const std::string own = read_file("/proc/self/cmdline");
  EXPECT_EQ(read_file(dir.path() / "cmdline_0"), own);
  EXPECT_EQ(read_file(dir.path() / "cmdline_1"), own);
}

TEST(LaunchLocalProcessesTest, ResolvesProgramThroughPath) {
  TempDir dir;
  LaunchOptions options = shell_launch(1, "echo ok > \"$DIR/out\"", dir);
  options.argv[0] = "sh";
  ASSERT_EQ(launch_local_processes(options), 0);
  EXPECT_EQ(read_file(dir.path() / "out"), "ok\n");
}

TEST(LaunchLocalProcessesTest, RejectsBadOptionsBeforeStartingAnything) {
  LaunchOptions options;
  options.nprocs = 0;
  options.argv = {"/bin/true"};
  try {
    launch_local_processes(options);
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("nprocs=0"), std::string::npos) << error.what();
  }

  options.nprocs = 2;
  options.argv = {"pipetrain-no-such-program-xyz"};
  try {
    launch_local_processes(options);
    ADD_FAILURE() << "expected std::runtime_error";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("pipetrain-no-such-program-xyz"), std::string::npos)
        << error.what();
  }

  options.argv = {"/nonexistent/dir/program"};
  EXPECT_THROW(launch_local_processes(options), std::runtime_error);
}

TEST(CurrentCommandLineTest, MatchesProcCmdline) {
  const std::vector<std::string> arguments = current_command_line();
  ASSERT_FALSE(arguments.empty());
  std::string joined;
  for (const std::string& argument : arguments) joined += argument + '\0';
  EXPECT_EQ(joined, read_file("/proc/self/cmdline"));
}

TEST(FindFreePortTest, ReturnsABindablePort) {
  const int port = find_free_port();
  ASSERT_GT(port, 0);
  ASSERT_LT(port, 65536);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  close(fd);
}

}  // namespace
}  // namespace pipetrain
