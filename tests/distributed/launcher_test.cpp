// Runs real child processes (/bin/sh scripts, and this test binary itself) through the local
// launcher, because the properties that matter (each rank sees its own variables, one failure
// stops the rest quickly, nothing hangs) only show up with real fork/exec/signals.
#include "pipetrain/launcher.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/errors.h"
#include "support/multiprocess.h"

namespace pipetrain::launcher_test {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr char kChildDirVariable[] = "PIPETRAIN_LAUNCHER_TEST_CHILD_DIR";
constexpr char kNodeDirVariable[] = "PIPETRAIN_LAUNCHER_TEST_NODE_DIR";

// What every rank of the multi-node tests reports, one line in $DIR/rank_$RANK.
constexpr char kReportLayout[] =
    "echo \"$RANK $WORLD_SIZE $MASTER_ADDR $MASTER_PORT $LOCAL_RANK $LOCAL_WORLD_SIZE "
    "$GROUP_RANK\" > \"$DIR/tmp_$RANK\" && mv \"$DIR/tmp_$RANK\" \"$DIR/rank_$RANK\"";

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

// The TwoNodeLaunchersSplitTheRanks test starts this binary once per "node", as a person starts
// the same command on every machine with NODE_RANK, MASTER_ADDR and MASTER_PORT exported. Each
// copy builds its options from that environment and launches its two ranks, which report their
// layout and then wait until all four reports exist: that only succeeds if both launchers ran at
// the same time, as they would on two machines.
const bool kRanAsNodeLauncher = [] {
  const char* dir = std::getenv(kNodeDirVariable);
  if (dir == nullptr) return false;
  int code = 1;
  try {
    LaunchOptions options = multi_node_launch_options(2, 2, current_environment());
    const std::string wait_for_all = R"(
      i=0
      while [ $i -lt 2000 ]; do
        n=0
        for r in 0 1 2 3; do if [ -f "$DIR/rank_$r" ]; then n=$((n+1)); fi; done
        if [ $n = 4 ]; then exit 0; fi
        sleep 0.01; i=$((i+1))
      done
      exit 9)";
    options.argv = {"/bin/sh", "-c", std::string(kReportLayout) + "\n" + wait_for_all};
    options.extra_env["DIR"] = dir;
    code = launch_local_processes(options);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "node launcher failed: %s\n", error.what());
  }
  std::_Exit(code);
}();

// The AKilledLaunchersRendezvousIsRemovedByTheNextLaunch test starts this binary as launchers
// (under a TMPDIR of its own) whose one rank touches "$DIR/started" and sleeps, and kills them.
constexpr char kKilledLauncherDirVariable[] = "PIPETRAIN_LAUNCHER_TEST_KILLED_DIR";
const bool kRanAsKilledLauncher = [] {
  const char* dir = std::getenv(kKilledLauncherDirVariable);
  if (dir == nullptr) return false;
  LaunchOptions options;
  options.argv = {"/bin/sh", "-c", "touch \"$DIR/started\"; exec sleep 60"};
  options.extra_env["DIR"] = dir;
  std::_Exit(launch_local_processes(options));
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

// Starts this test binary with exactly `env` as its environment (without the gtest arguments: the
// copies exit during static initialisation anyway).
pid_t spawn_this_binary(const EnvironmentVariables& env) {
  const std::string program = fs::read_symlink("/proc/self/exe").string();
  std::vector<std::string> entries;
  for (const auto& [name, value] : env) entries.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (std::string& entry : entries) envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::string argv0 = program;
  char* argv[] = {argv0.data(), nullptr};
  pid_t pid = -1;
  const int error = posix_spawn(&pid, program.c_str(), nullptr, nullptr, argv, envp.data());
  if (error != 0) throw std::runtime_error("posix_spawn failed: " + std::to_string(error));
  return pid;
}

// Exit code of `pid`, or -1 (after killing it) if it is still running after `timeout`, so that
// a launcher that hangs fails the test instead of the whole run.
int wait_for_exit(pid_t pid, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  int status = 0;
  for (;;) {
    const pid_t reaped = waitpid(pid, &status, WNOHANG);
    if (reaped == pid) break;
    if (reaped < 0 && errno != EINTR) return -1;
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

struct ReportedLayout {
  int rank = -1;
  int world_size = 0;
  std::string address;
  int port = 0;
  int local_rank = -1;
  int local_world_size = 0;
  int group_rank = -1;
};

ReportedLayout read_layout(const fs::path& file) {
  ReportedLayout layout;
  std::istringstream line(read_file(file));
  line >> layout.rank >> layout.world_size >> layout.address >> layout.port >> layout.local_rank >>
      layout.local_world_size >> layout.group_rank;
  return layout;
}

// The message of the std::invalid_argument that `call` throws; anything else is a text in angle
// brackets, which no test's expected words match.
template <typename Call>
std::string invalid_argument_message(Call&& call) {
  return testing::error_of<std::invalid_argument>(std::forward<Call>(call));
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

bool wait_for_file(const fs::path& path, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!fs::exists(path)) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// What a launch returned, how long it took and what it wrote to stderr.
struct LaunchResult {
  int code = -1;
  double seconds = 0;
  std::string err;
};

LaunchResult launch_capturing_stderr(const LaunchOptions& options) {
  ::testing::internal::CaptureStderr();
  const auto start = Clock::now();
  LaunchResult result;
  result.code = launch_local_processes(options);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  result.err = ::testing::internal::GetCapturedStderr();
  return result;
}

// Shell lines that touch "$DIR/<ready_file>" once their SIGTERM trap is in place (so whoever
// waits for that file cannot signal too early), then sleep until SIGTERM comes and run
// `on_sigterm`. Without the signal they go on after a minute.
std::string sleep_until_sigterm(const std::string& on_sigterm, const std::string& ready_file) {
  const std::string trap = "trap 'kill $pid 2>/dev/null; " + on_sigterm + "' TERM\n";
  const std::string touch = "touch \"$DIR/" + ready_file + "\"\n";
  return trap + "sleep 60 >/dev/null 2>&1 &\npid=$!\n" + touch + "wait\n";
}

// A script in which rank `stays` runs `stay_script`, which touches "$DIR/ready" once it may be
// stopped, and every other rank exits with `exit_code` as soon as that file exists (at the latest
// after ten seconds).
std::string fail_once_ready(int stays, const std::string& stay_script, int exit_code) {
  const std::string wait_for_ready =
      "i=0\n"
      "while [ ! -f \"$DIR/ready\" ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done\n";
  return "if [ \"$RANK\" = " + std::to_string(stays) + " ]; then\n" + stay_script + "else\n" +
         wait_for_ready + "exit " + std::to_string(exit_code) + "\nfi\n";
}

// On one node the ranks meet in a file in a private directory, never at a TCP port (which Torch
// 1.13 would open on every interface); the directory is gone when the launch returns.
TEST(LaunchLocalProcessesTest, AllSucceedWithDistinctRanksAndOneRendezvousFile) {
  TempDir dir;
  LaunchOptions options = shell_launch(
      3,
      "echo \"$RANK $WORLD_SIZE $MASTER_ADDR ${MASTER_PORT:-none} $LOCAL_RANK $LOCAL_WORLD_SIZE "
      "$GROUP_RANK $EXTRA $PIPETRAIN_RENDEZVOUS_FILE "
      "$(stat -c %a \"$(dirname \"$PIPETRAIN_RENDEZVOUS_FILE\")\")\" > \"$DIR/rank_$RANK\"",
      dir);
  options.extra_env["EXTRA"] = "extra-value";
  options.extra_env["MASTER_PORT"] = "29500";  // an enclosing launch's, which must not leak in
  ASSERT_EQ(launch_local_processes(options), 0);

  std::set<int> ranks;
  std::set<std::string> files;
  for (int i = 0; i < 3; ++i) {
    std::istringstream line(read_file(dir.path() / ("rank_" + std::to_string(i))));
    int rank = -1, world_size = 0, local_rank = -1, local_world_size = 0, group = -1;
    std::string address, port, extra, file, mode;
    line >> rank >> world_size >> address >> port >> local_rank >> local_world_size >> group >>
        extra >> file >> mode;
    EXPECT_EQ(rank, i);
    EXPECT_EQ(world_size, 3);
    EXPECT_EQ(address, "127.0.0.1");
    EXPECT_EQ(port, "none");
    EXPECT_EQ(local_rank, i);
    EXPECT_EQ(local_world_size, 3);
    EXPECT_EQ(group, 0);
    EXPECT_EQ(extra, "extra-value");
    EXPECT_EQ(mode, "700") << file;
    ranks.insert(rank);
    files.insert(file);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  ASSERT_EQ(files.size(), 1u);
  EXPECT_FALSE(fs::exists(fs::path(*files.begin()).parent_path())) << *files.begin();
}

TEST(LaunchLocalProcessesTest, FirstFailureStopsTheOthersQuickly) {
  TempDir dir;
  // Rank 1 fails only once rank 0 has installed its SIGTERM trap, so that the trap (and not
  // a SIGTERM that beat it) is what ends rank 0.
  const std::string script =
      fail_once_ready(0,
                      sleep_until_sigterm("echo stopped > \"$DIR/stopped\"; exit 143", "ready") +
                          "echo finished > \"$DIR/finished\"\n",
                      3);
  const LaunchResult result = launch_capturing_stderr(shell_launch(2, script, dir));

  EXPECT_EQ(result.code, 3);
  EXPECT_LT(result.seconds, 10.0);
  EXPECT_TRUE(fs::exists(dir.path() / "stopped")) << "rank 0 never saw SIGTERM";
  EXPECT_FALSE(fs::exists(dir.path() / "finished"));
  EXPECT_TRUE(contains(result.err,
                       "pipetrain: rank 1 failed with exit code 3; stopping the other 1 rank\n"))
      << result.err;
}

TEST(LaunchLocalProcessesTest, RankIgnoringSigtermIsKilledAfterGracePeriod) {
  TempDir dir;
  const std::string ignore_sigterm = "trap '' TERM\ntouch \"$DIR/ready\"\nexec sleep 60\n";
  LaunchOptions options = shell_launch(2, fail_once_ready(0, ignore_sigterm, 5), dir);
  options.grace_period = std::chrono::milliseconds(300);
  const LaunchResult result = launch_capturing_stderr(options);

  EXPECT_EQ(result.code, 5);
  EXPECT_LT(result.seconds, 5.0);
  EXPECT_TRUE(contains(result.err, "sending SIGKILL")) << result.err;
}

TEST(LaunchLocalProcessesTest, ChildKilledBySignalReturns128PlusSignal) {
  TempDir dir;
  const LaunchResult result = launch_capturing_stderr(
      shell_launch(2, "if [ \"$RANK\" = 1 ]; then kill -KILL $$; fi; exit 0", dir));
  EXPECT_EQ(result.code, 128 + SIGKILL);
  EXPECT_TRUE(contains(result.err, "pipetrain: rank 1 was killed by signal SIGKILL")) << result.err;
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
  const std::string script =
      sleep_until_sigterm("echo got > \"$DIR/term_$RANK\"; exit 0", "ready_$RANK");
  std::thread signaller([&] {
    // The ready files exist only after the launcher installed its handlers, so the signal
    // cannot hit this test process's default SIGTERM action.
    if (wait_for_file(dir.path() / "ready_0", std::chrono::seconds(10)) &&
        wait_for_file(dir.path() / "ready_1", std::chrono::seconds(10))) {
      kill(getpid(), SIGTERM);
    }
  });
  const LaunchResult result = launch_capturing_stderr(shell_launch(2, script, dir));
  signaller.join();

  // The children exited 0 after the forwarded signal, yet the run was interrupted.
  EXPECT_EQ(result.code, 128 + SIGTERM);
  EXPECT_LT(result.seconds, 10.0);
  EXPECT_TRUE(fs::exists(dir.path() / "term_0"));
  EXPECT_TRUE(fs::exists(dir.path() / "term_1"));
  EXPECT_TRUE(contains(result.err, "received SIGTERM")) << result.err;

  struct sigaction current {};
  sigaction(SIGTERM, nullptr, &current);
  EXPECT_EQ(current.sa_handler, SIG_DFL);
}

// Sends SIGTERM to this process (the launcher) once every rank of `nprocs` has touched
// "$DIR/ready_$RANK", i.e. installed its trap under the launcher's handlers.
std::thread sigterm_when_ready(const TempDir& dir, int nprocs) {
  return std::thread([&dir, nprocs] {
    for (int rank = 0; rank < nprocs; ++rank) {
      if (!wait_for_file(dir.path() / ("ready_" + std::to_string(rank)), std::chrono::seconds(10)))
        return;
    }
    kill(getpid(), SIGTERM);
  });
}

// A scheduler's SIGTERM to the launcher: the ranks finish their step and save, which may take far
// longer than the grace a failure leaves the survivors, and the launch exits 143 (requeue).
TEST(LaunchLocalProcessesTest, SigtermWaitsForTheRanksToSaveAndExits143) {
  TempDir dir;
  const std::string save_then_exit = "sleep 1; touch \"$DIR/saved_$RANK\"; exit 143";
  LaunchOptions options = shell_launch(2, sleep_until_sigterm(save_then_exit, "ready_$RANK"), dir);
  options.grace_period = std::chrono::milliseconds(100);  // a failure's, not a signal's
  std::thread signaller = sigterm_when_ready(dir, 2);
  const LaunchResult result = launch_capturing_stderr(options);
  signaller.join();

  EXPECT_EQ(result.code, 128 + SIGTERM) << result.err;
  EXPECT_TRUE(fs::exists(dir.path() / "saved_0")) << result.err;
  EXPECT_TRUE(fs::exists(dir.path() / "saved_1")) << result.err;
  EXPECT_FALSE(contains(result.err, "SIGKILL")) << result.err;
}

// Ranks still running signal_grace_period after the signal are killed, and the launch still
// exits 128 + the signal, not 137: the run was interrupted, not broken.
TEST(LaunchLocalProcessesTest, RanksOutlastingTheSignalGraceAreKilledAndTheLaunchExits143) {
  TempDir dir;
  const std::string ignore_sigterm = "trap '' TERM\ntouch \"$DIR/ready_$RANK\"\nexec sleep 60\n";
  LaunchOptions options = shell_launch(2, ignore_sigterm, dir);
  options.signal_grace_period = std::chrono::milliseconds(300);
  std::thread signaller = sigterm_when_ready(dir, 2);
  const LaunchResult result = launch_capturing_stderr(options);
  signaller.join();

  EXPECT_EQ(result.code, 128 + SIGTERM) << result.err;
  EXPECT_LT(result.seconds, 30.0);
  EXPECT_TRUE(contains(result.err, "sending SIGKILL")) << result.err;
}

// The rendezvous directories under TMPDIR.
std::vector<fs::path> rendezvous_directories(const fs::path& tmp) {
  std::vector<fs::path> found;
  for (const auto& entry : fs::directory_iterator(tmp)) {
    if (entry.path().filename().string().rfind("pipetrain-rendezvous-", 0) == 0) {
      found.push_back(entry.path());
    }
  }
  return found;
}

// SIGKILL leaves a launcher no chance to remove its rendezvous directory; the next launch on the
// machine does, and leaves a live launcher's alone.
TEST(LaunchLocalProcessesTest, AKilledLaunchersRendezvousIsRemovedByTheNextLaunch) {
  TempDir tmp;
  ScopedEnvironmentVariable scoped_tmp("TMPDIR", tmp.path().string());
  // Two launchers whose ranks sleep: the first is killed, the second lives on.
  TempDir killed_dir, live_dir;
  std::vector<fs::path> directories;
  std::vector<pid_t> launchers;
  for (const TempDir* dir : {&killed_dir, &live_dir}) {
    launchers.push_back(spawn_this_binary({{"TMPDIR", tmp.path().string()},
                                           {"PATH", "/usr/bin:/bin"},
                                           {kKilledLauncherDirVariable, dir->path().string()}}));
    ASSERT_TRUE(wait_for_file(dir->path() / "started", std::chrono::seconds(20)));
    for (const fs::path& found : rendezvous_directories(tmp.path())) {
      if (std::find(directories.begin(), directories.end(), found) == directories.end()) {
        directories.push_back(found);
      }
    }
  }
  ASSERT_EQ(directories.size(), 2u);
  kill(launchers[0], SIGKILL);
  EXPECT_EQ(wait_for_exit(launchers[0], std::chrono::seconds(20)), 128 + SIGKILL);
  ASSERT_TRUE(fs::exists(directories[0]));  // left behind

  EXPECT_EQ(launch_local_processes(shell_launch(1, "exit 0", killed_dir)), 0);
  EXPECT_FALSE(fs::exists(directories[0]));
  EXPECT_TRUE(fs::exists(directories[1]));
  EXPECT_EQ(rendezvous_directories(tmp.path()).size(), 1u);
  kill(launchers[1], SIGKILL);
  wait_for_exit(launchers[1], std::chrono::seconds(20));
}

// Each rank claims the report of an error all ranks meet and of one of its own, and writes what
// it was told.
PIPETRAIN_WORKER(report_claim_worker) {
  const std::string rank = testing::env_or("RANK", "?");
  std::ofstream(testing::env_or("RESULT_DIR", ".") + "/claims-" + rank)
      << first_to_report("a refusal every rank meets") << " "
      << first_to_report("rank " + rank + "'s own error") << "\n";
}

// Every rank printed an error they all met, once per rank: the first to claim it reports it for
// all, while an error of a rank's own is each rank's to report. Outside a launch, every report
// is made.
TEST(LaunchLocalProcessesTest, AnErrorEveryRankMeetsIsReportedOnce) {
  const std::string dir = testing::make_temp_dir("report-claims");
  ASSERT_EQ(testing::run_ranks(3, "report_claim_worker", {{"RESULT_DIR", dir}}), 0);
  int shared_reports = 0;
  for (int rank = 0; rank < 3; ++rank) {
    int shared = -1, own = -1;
    std::istringstream(read_file(fs::path(dir) / ("claims-" + std::to_string(rank)))) >> shared >>
        own;
    shared_reports += shared;
    EXPECT_EQ(own, 1) << "rank " << rank;
  }
  EXPECT_EQ(shared_reports, 1);
  EXPECT_TRUE(first_to_report("said here"));
  EXPECT_TRUE(first_to_report("said here"));
  fs::remove_all(dir);
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
  auto launch = [&] { launch_local_processes(options); };
  options.nprocs = 0;
  options.argv = {"/bin/true"};
  std::string message = invalid_argument_message(launch);
  EXPECT_TRUE(contains(message, "nprocs=0")) << message;

  options.nprocs = 2;
  options.argv = {"pipetrain-no-such-program-xyz"};
  message = testing::error_of<std::runtime_error>(launch);
  EXPECT_TRUE(contains(message, "pipetrain-no-such-program-xyz")) << message;

  options.argv = {"/nonexistent/dir/program"};
  EXPECT_THROW(launch_local_processes(options), std::runtime_error);
}

TEST(LaunchLocalProcessesTest, TwoNodeLaunchersSplitTheRanks) {
  TempDir dir;
  const int port = find_free_port();
  EnvironmentVariables env = current_environment();
  // Whatever launched this test must not leak into the nodes' layout.
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"}) {
    env.erase(name);
  }
  env[kNodeDirVariable] = dir.path().string();
  env["MASTER_ADDR"] = "127.0.0.1";
  env["MASTER_PORT"] = std::to_string(port);
  env["NODE_RANK"] = "0";
  const pid_t node0 = spawn_this_binary(env);
  env["NODE_RANK"] = "1";
  const pid_t node1 = spawn_this_binary(env);
  EXPECT_EQ(wait_for_exit(node0, std::chrono::seconds(60)), 0);
  EXPECT_EQ(wait_for_exit(node1, std::chrono::seconds(60)), 0);

  for (int rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const ReportedLayout layout = read_layout(dir.path() / ("rank_" + std::to_string(rank)));
    EXPECT_EQ(layout.rank, rank);
    EXPECT_EQ(layout.world_size, 4);
    EXPECT_EQ(layout.address, "127.0.0.1");
    EXPECT_EQ(layout.port, port);
    EXPECT_EQ(layout.local_rank, rank % 2);
    EXPECT_EQ(layout.local_world_size, 2);
    EXPECT_EQ(layout.group_rank, rank / 2);
  }
}

TEST(LaunchLocalProcessesTest, SingleNodeUsesGivenAddressAndPort) {
  TempDir dir;
  LaunchOptions options = shell_launch(2, kReportLayout, dir);
  options.main_address = "localhost";
  options.main_port = 29517;
  ASSERT_EQ(launch_local_processes(options), 0);
  for (int rank = 0; rank < 2; ++rank) {
    const ReportedLayout layout = read_layout(dir.path() / ("rank_" + std::to_string(rank)));
    EXPECT_EQ(layout.rank, rank);
    EXPECT_EQ(layout.world_size, 2);
    EXPECT_EQ(layout.address, "localhost");
    EXPECT_EQ(layout.port, 29517);
    EXPECT_EQ(layout.group_rank, 0);
  }
}

TEST(LaunchLocalProcessesTest, FailureOnOneOfSeveralNodesNamesTheGlobalRank) {
  TempDir dir;
  // This is node 1 of 2 with ranks 2 and 3; rank 3 fails once rank 2 traps SIGTERM.
  LaunchOptions options =
      shell_launch(2, fail_once_ready(2, sleep_until_sigterm("exit 143", "ready"), 4), dir);
  options.nnodes = 2;
  options.node_rank = 1;
  options.main_address = "127.0.0.1";
  options.main_port = find_free_port();
  const LaunchResult result = launch_capturing_stderr(options);
  EXPECT_EQ(result.code, 4);
  EXPECT_TRUE(contains(result.err,
                       "pipetrain: rank 3 failed with exit code 4; stopping the other 1 rank on "
                       "this node\n"))
      << result.err;
}

TEST(LaunchLocalProcessesTest, RejectsBadNodeLayoutBeforeStartingAnything) {
  TempDir dir;
  const LaunchOptions good = [&] {
    LaunchOptions options = shell_launch(2, "touch \"$DIR/started\"", dir);
    options.nnodes = 2;
    options.node_rank = 1;
    options.main_address = "127.0.0.1";
    options.main_port = 29500;
    return options;
  }();
  struct Case {
    std::function<void(LaunchOptions&)> spoil;  // what turns `good` into a bad layout
    std::vector<std::string> words;             // what its error must say
  };
  const std::vector<Case> cases = {
      {[](LaunchOptions& o) { o.node_rank = 2; },
       {"node_rank=2 must be in [0, nnodes=2)", "NODE_RANK"}},
      {[](LaunchOptions& o) { o.node_rank = -1; }, {"node_rank=-1"}},
      {[](LaunchOptions& o) {
         o.nnodes = 0;
         o.node_rank = 0;
       },
       {"nnodes=0 must be at least 1"}},
      {[](LaunchOptions& o) { o.main_address.clear(); }, {"MASTER_ADDR", "nnodes=2", "node 0"}},
      {[](LaunchOptions& o) { o.main_port = 0; },
       {"MASTER_PORT", "nnodes=2", "the same on every node"}},
      {[](LaunchOptions& o) { o.main_port = 65536; }, {"main_port=65536"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    LaunchOptions options = good;
    cases[i].spoil(options);
    const std::string message = invalid_argument_message([&] { launch_local_processes(options); });
    for (const std::string& words : cases[i].words) {
      EXPECT_TRUE(contains(message, words)) << message;
    }
  }

  EXPECT_FALSE(fs::exists(dir.path() / "started"));
}

TEST(MultiNodeLaunchOptionsTest, SingleNodeNeedsNoVariables) {
  const LaunchOptions options = multi_node_launch_options(3, 1, {});
  EXPECT_EQ(options.nprocs, 3);
  EXPECT_EQ(options.nnodes, 1);
  EXPECT_EQ(options.node_rank, 0);
  // Left for the launcher to fill in with 127.0.0.1 and a free port at launch time.
  EXPECT_EQ(options.main_address, "");
  EXPECT_EQ(options.main_port, 0);
  EXPECT_TRUE(options.argv.empty());
  EXPECT_TRUE(options.extra_env.empty());

  const LaunchOptions given =
      multi_node_launch_options(2, 1, {{"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29500"}});
  EXPECT_EQ(given.main_address, "10.1.2.3");
  EXPECT_EQ(given.main_port, 29500);

  const std::string message = invalid_argument_message([] {
    multi_node_launch_options(2, 1, {{"NODE_RANK", "1"}});
  });
  EXPECT_TRUE(contains(message, "NODE_RANK=1 is outside [0, nnodes=1)")) << message;
}

TEST(MultiNodeLaunchOptionsTest, ReadsNodeRankAndRendezvous) {
  const EnvironmentVariables env = {
      {"NODE_RANK", "1"}, {"MASTER_ADDR", "node-a.cluster"}, {"MASTER_PORT", "29500"}};
  const LaunchOptions options = multi_node_launch_options(4, 2, env);
  EXPECT_EQ(options.nprocs, 4);
  EXPECT_EQ(options.nnodes, 2);
  EXPECT_EQ(options.node_rank, 1);
  EXPECT_EQ(options.main_address, "node-a.cluster");
  EXPECT_EQ(options.main_port, 29500);
}

TEST(MultiNodeLaunchOptionsTest, GroupRankIsTheFallbackAndNodeRankWins) {
  EnvironmentVariables env = {
      {"GROUP_RANK", "2"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}};
  EXPECT_EQ(multi_node_launch_options(1, 3, env).node_rank, 2);
  env["NODE_RANK"] = "1";
  EXPECT_EQ(multi_node_launch_options(1, 3, env).node_rank, 1);
}

TEST(MultiNodeLaunchOptionsTest, MalformedNodeRankNamesTheVariable) {
  const EnvironmentVariables rendezvous = {{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}};
  auto message_for = [&](const std::string& name, const std::string& value) {
    EnvironmentVariables env = rendezvous;
    env[name] = value;
    return invalid_argument_message([&] { multi_node_launch_options(2, 2, env); });
  };
  for (const std::string value : {"one", "1 ", "", "0x1", "1.0"}) {
    const std::string message = message_for("NODE_RANK", value);
    EXPECT_TRUE(contains(message, "NODE_RANK='" + value + "' is not an integer")) << message;
    EXPECT_TRUE(contains(message, "index in [0, 2)")) << message;
  }
  std::string message = message_for("NODE_RANK", "2");
  EXPECT_TRUE(contains(message, "NODE_RANK=2 is outside [0, nnodes=2)")) << message;
  message = message_for("NODE_RANK", "-1");
  EXPECT_TRUE(contains(message, "NODE_RANK=-1 is outside")) << message;
  message = message_for("GROUP_RANK", "x");
  EXPECT_TRUE(contains(message, "GROUP_RANK='x' is not an integer")) << message;
}

TEST(MultiNodeLaunchOptionsTest, SeveralNodesNeedEveryVariable) {
  const EnvironmentVariables complete = {
      {"NODE_RANK", "0"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}};
  auto message_for = [&](const std::string& name, const std::optional<std::string>& value) {
    EnvironmentVariables env = complete;
    if (value) {
      env[name] = *value;
    } else {
      env.erase(name);
    }
    return invalid_argument_message([&] { multi_node_launch_options(2, 2, env); });
  };
  std::string message = message_for("NODE_RANK", std::nullopt);
  EXPECT_TRUE(contains(message, "NODE_RANK is not set, but with nnodes=2")) << message;
  message = message_for("MASTER_ADDR", std::nullopt);
  EXPECT_TRUE(contains(message, "MASTER_ADDR is not set, but with nnodes=2")) << message;
  message = message_for("MASTER_ADDR", "");
  EXPECT_TRUE(contains(message, "MASTER_ADDR is set but empty")) << message;
  message = message_for("MASTER_PORT", std::nullopt);
  EXPECT_TRUE(contains(message, "MASTER_PORT is not set, but with nnodes=2")) << message;
  for (const std::string value : {"0", "65536", "http", "-5"}) {
    message = message_for("MASTER_PORT", value);
    EXPECT_TRUE(contains(message, "MASTER_PORT")) << message;
    EXPECT_TRUE(contains(message, value)) << message;
    EXPECT_TRUE(contains(message, "[1, 65535]")) << message;
  }

  message = invalid_argument_message([&] { multi_node_launch_options(0, 2, complete); });
  EXPECT_TRUE(contains(message, "nprocs=0")) << message;
  message = invalid_argument_message([&] { multi_node_launch_options(2, 0, complete); });
  EXPECT_TRUE(contains(message, "nnodes=0")) << message;
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
}  // namespace pipetrain::launcher_test
