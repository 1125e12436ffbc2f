// pipetrain's built-in replacement for `torchrun --nproc-per-node N` (with --nnodes/--node-rank
// and a fixed rendezvous for several machines). The parent forks N children that exec the
// program with torchrun's variables, then only supervises: a pipeline stage that dies leaves its
// neighbours blocked in send/recv forever, so the first failure stops everyone on this machine,
// and nothing here may wait without a bound (waitpid never blocks; a self-pipe written by the
// signal handlers wakes the loop, with a short poll timeout as a safety net). Launchers on
// different machines never talk to each other; they only agree because every node is given the
// same nnodes, nprocs, MASTER_ADDR and MASTER_PORT.
#include "pipetrain/launcher.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>

#include "environment_variables.h"
#include "pipetrain/error.h"
#include "util/usable_cpus.h"

namespace pipetrain {
namespace {

using Clock = std::chrono::steady_clock;

// Longest the wait loop sleeps without looking at its children, in case a wake-up from the
// signal handler is lost (e.g. a handler that another thread installed over ours).
constexpr int kMaxPollMilliseconds = 200;

// State shared with the signal handler; sig_atomic_t because that is all a handler may touch.
std::atomic<bool> g_launch_active{false};
volatile sig_atomic_t g_wake_fd = -1;
volatile sig_atomic_t g_stop_signal = 0;
volatile sig_atomic_t g_stop_signal_count = 0;

void on_signal(int signo) {
  const int saved_errno = errno;
  if (signo != SIGCHLD) {
    g_stop_signal = signo;
    g_stop_signal_count = g_stop_signal_count + 1;
  }
  const int fd = g_wake_fd;
  if (fd >= 0) {
    const char byte = 0;
    // A full pipe already guarantees a wake-up, so a failed write needs no handling.
    const ssize_t ignored = write(fd, &byte, 1);
    (void)ignored;
  }
  errno = saved_errno;
}

constexpr char kRendezvousPrefix[] = "pipetrain-rendezvous-";
// Locked (flock) by the launcher whose directory holds it, for as long as that launcher lives.
constexpr char kLauncherLock[] = "launcher.lock";

// Removes the rendezvous directories in `tmp` of this user's launchers that died without removing
// theirs (SIGKILL, a crash): the kernel drops a dead process's flock, so a lock file that can be
// locked marks a directory nobody will read again. A directory without one is left alone.
void remove_abandoned_rendezvous(const std::string& tmp) {
  DIR* entries = opendir(tmp.c_str());
  if (entries == nullptr) return;
  while (const dirent* entry = readdir(entries)) {
    if (std::strncmp(entry->d_name, kRendezvousPrefix, sizeof(kRendezvousPrefix) - 1) != 0) {
      continue;
    }
    const std::string path = tmp + "/" + entry->d_name;
    struct stat info {};
    if (lstat(path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode) || info.st_uid != geteuid()) {
      continue;
    }
    const int lock = open((path + "/" + kLauncherLock).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (lock < 0) continue;
    if (flock(lock, LOCK_EX | LOCK_NB) == 0) {
      std::error_code ignored;  // another launcher may be removing it too
      std::filesystem::remove_all(path, ignored);
    }
    close(lock);
  }
  closedir(entries);
}

// A directory only this user can enter, holding the rendezvous file of one launch; removed with
// whatever the ranks left in it when the launch ends, or by a later launch if this one is killed.
class RendezvousDirectory {
 public:
  RendezvousDirectory() {
    const char* tmp_variable = std::getenv("TMPDIR");
    const std::string tmp =
        tmp_variable != nullptr && *tmp_variable != '\0' ? tmp_variable : "/tmp";
    remove_abandoned_rendezvous(tmp);
    std::string pattern = tmp + "/" + kRendezvousPrefix + "XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("pipetrain: cannot create a rendezvous directory " + pattern + ": " +
                               std::strerror(errno) + "; set TMPDIR to a writable directory");
    }
    path_ = pattern;
    // Locked before it takes its name, so no other launcher ever finds the lock file unlocked.
    const std::string unnamed = path_ + "/" + kLauncherLock + ".new";
    lock_ = open(unnamed.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (lock_ < 0 || flock(lock_, LOCK_EX) != 0 ||
        rename(unnamed.c_str(), (path_ + "/" + kLauncherLock).c_str()) != 0) {
      const int error = errno;
      remove();
      throw std::runtime_error("pipetrain: cannot lock the rendezvous directory " + path_ + ": " +
                               std::strerror(error) + "; set TMPDIR to a writable directory");
    }
  }
  RendezvousDirectory(const RendezvousDirectory&) = delete;
  RendezvousDirectory& operator=(const RendezvousDirectory&) = delete;
  ~RendezvousDirectory() { remove(); }
  std::string file() const { return path_ + "/store"; }

 private:
  void remove() {
    std::error_code ignored;  // A directory left behind in the temp dir harms nothing.
    std::filesystem::remove_all(path_, ignored);
    if (lock_ >= 0) close(lock_);  // only now: nobody else may remove it while it is in use
  }

  std::string path_;
  int lock_ = -1;
};

// SIGUSR1 too: SLURM's --signal and cluster managers send it as a preemption notice, and the ranks
// (Trainer::fit) stop on it with a checkpoint.
constexpr int kHandledSignals[] = {SIGCHLD, SIGINT, SIGTERM, SIGUSR1};

// Installs the handlers and the self-pipe for one launch and restores the previous handlers
// afterwards, so that the caller's own signal handling survives a launch.
class SignalScope {
 public:
  SignalScope() {
    bool expected = false;
    if (!g_launch_active.compare_exchange_strong(expected, true)) {
      throw std::runtime_error(
          "pipetrain: launch_local_processes is already running in this process; it owns the "
          "SIGCHLD/SIGINT/SIGTERM/SIGUSR1 handlers, so launches must not overlap");
    }
    int fds[2];
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      const int error = errno;
      g_launch_active = false;
      throw std::runtime_error(std::string("pipetrain: cannot create the launcher's pipe: ") +
                               std::strerror(error));
    }
    read_fd_ = fds[0];
    write_fd_ = fds[1];
    g_stop_signal = 0;
    g_stop_signal_count = 0;
    g_wake_fd = write_fd_;
    struct sigaction action {};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    // SA_RESTART: other threads' system calls should not start failing with EINTR because of us.
    action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (size_t i = 0; i < std::size(kHandledSignals); ++i) {
      sigaction(kHandledSignals[i], &action, &previous_[i]);
    }
  }

  ~SignalScope() {
    for (size_t i = 0; i < std::size(kHandledSignals); ++i) {
      sigaction(kHandledSignals[i], &previous_[i], nullptr);
    }
    g_wake_fd = -1;
    close(read_fd_);
    close(write_fd_);
    g_launch_active = false;
  }

  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

  // Sleeps until a signal arrives or `timeout_ms` passes, then empties the pipe.
  void wait(int timeout_ms) const {
    pollfd fd{read_fd_, POLLIN, 0};
    // EINTR only means a signal arrived, which is a reason to wake up anyway.
    poll(&fd, 1, timeout_ms);
    char buffer[64];
    while (read(read_fd_, buffer, sizeof(buffer)) > 0) {
    }
  }

 private:
  int read_fd_ = -1;
  int write_fd_ = -1;
  struct sigaction previous_[std::size(kHandledSignals)]{};
};

struct Child {
  pid_t pid = -1;
  // Global rank: what the user sees in RANK and in the rank's own log lines.
  int64_t rank = 0;
  bool running = false;
};

// If anything throws while children exist, they must not outlive the launch unsupervised.
class ChildrenGuard {
 public:
  explicit ChildrenGuard(std::vector<Child>& children) : children_(children) {}
  ~ChildrenGuard() {
    for (Child& child : children_) {
      if (!child.running) continue;
      kill(child.pid, SIGKILL);
      int status = 0;
      while (waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
      }
      child.running = false;
    }
  }
  ChildrenGuard(const ChildrenGuard&) = delete;
  ChildrenGuard& operator=(const ChildrenGuard&) = delete;

 private:
  std::vector<Child>& children_;
};

std::string count_ranks(size_t count) {
  return std::to_string(count) + (count == 1 ? " rank" : " ranks");
}

bool is_executable_file(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) && access(path.c_str(), X_OK) == 0;
}

// Resolves the program like execvp, but in the parent: after fork only async-signal-safe calls
// are allowed, and a missing program is reported once as an exception instead of N times as
// exit code 127.
std::string resolve_program(const std::string& program, const EnvironmentVariables& child_env) {
  if (program.empty()) {
    throw std::invalid_argument(
        "pipetrain: LaunchOptions::argv[0] is empty; set it to the program to run");
  }
  if (program.find('/') != std::string::npos) {
    if (!is_executable_file(program)) {
      throw std::runtime_error("pipetrain: LaunchOptions::argv[0]='" + program +
                               "' is not an executable file; pass the path of a program");
    }
    return program;
  }
  auto path_it = child_env.find("PATH");
  const std::string path = path_it == child_env.end() ? "/bin:/usr/bin" : path_it->second;
  size_t start = 0;
  while (start <= path.size()) {
    size_t colon = path.find(':', start);
    if (colon == std::string::npos) colon = path.size();
    const std::string directory = path.substr(start, colon - start);
    const std::string candidate = (directory.empty() ? "." : directory) + "/" + program;
    if (is_executable_file(candidate)) return candidate;
    start = colon + 1;
  }
  throw std::runtime_error("pipetrain: LaunchOptions::argv[0]='" + program +
                           "' was not found in PATH='" + path +
                           "'; pass an absolute path or add its directory to PATH");
}

// Async-signal-safe decimal formatting for the child's exec error message.
size_t format_decimal(int value, char* out) {
  char digits[16];
  size_t count = 0;
  unsigned magnitude = value < 0 ? 0u - static_cast<unsigned>(value) : static_cast<unsigned>(value);
  do {
    digits[count++] = static_cast<char>('0' + magnitude % 10);
    magnitude /= 10;
  } while (magnitude != 0 && count < sizeof(digits));
  size_t length = 0;
  if (value < 0) out[length++] = '-';
  while (count > 0) out[length++] = digits[--count];
  return length;
}

// Runs in the forked child: only async-signal-safe calls until execve.
[[noreturn]] void exec_child(const char* path, char* const* argv, char* const* envp, pid_t parent,
                             const std::string& exec_error_prefix) {
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  for (int signo : kHandledSignals) sigaction(signo, &default_action, nullptr);
  // Die with the parent: otherwise a killed launcher leaves N processes holding GPUs. SIGKILL
  // because a child that traps SIGTERM might linger. The getppid check covers a parent that
  // died before prctl took effect.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(126);
  // The parent blocked these signals around fork; the program must start with none blocked.
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execve(path, argv, envp);
  char message[512];
  size_t length = std::min(exec_error_prefix.size(), sizeof(message) - 32);
  std::memcpy(message, exec_error_prefix.data(), length);
  length += format_decimal(errno, message + length);
  message[length++] = '\n';
  const ssize_t ignored = write(STDERR_FILENO, message, length);
  (void)ignored;
  _exit(127);
}

pid_t spawn_child(const std::string& path, const std::vector<char*>& argv,
                  const std::vector<char*>& envp, const std::string& exec_error_prefix) {
  const pid_t parent = getpid();
  // Blocked across fork so that our handler can never run in the child before it resets it.
  sigset_t blocked;
  sigset_t previous;
  sigemptyset(&blocked);
  for (int signo : kHandledSignals) sigaddset(&blocked, signo);
  pthread_sigmask(SIG_BLOCK, &blocked, &previous);
  const pid_t pid = fork();
  if (pid == 0) exec_child(path.c_str(), argv.data(), envp.data(), parent, exec_error_prefix);
  const int fork_error = errno;
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (pid < 0) {
    throw std::runtime_error(std::string("pipetrain: fork failed: ") + std::strerror(fork_error) +
                             "; reduce LaunchOptions::nprocs or raise the process limit");
  }
  return pid;
}

// Supervises the children until all have exited; see launch_local_processes for the policy.
// `scope` ends the failure line, so that on one of several nodes nobody mistakes "the other
// ranks" for the whole job.
int supervise(std::vector<Child>& children, const SignalScope& signals,
              const LaunchOptions& options, const std::string& scope) {
  size_t running = 0;
  for (const Child& child : children) running += child.running ? 1 : 0;
  int first_failure = 0;
  int stop_signal = 0;
  int handled_signal_count = 0;
  bool stopping = false;
  bool killed = false;
  Clock::time_point kill_deadline;
  std::chrono::milliseconds grace_period{0};

  auto signal_running = [&](int signo) {
    for (const Child& child : children) {
      // Only unreaped children: their pids cannot have been reused yet.
      if (child.running) kill(child.pid, signo);
    }
  };
  // A failed rank leaves the others nothing to finish (their pipeline is broken): they get
  // grace_period to flush. A signal from outside (a scheduler's preemption notice) finds them
  // healthy: they finish their step and save last.ckpt, which takes up to signal_grace_period.
  auto begin_stopping = [&](int signo, std::chrono::milliseconds grace) {
    signal_running(signo);
    if (!stopping) {
      stopping = true;
      grace_period = grace;
      kill_deadline = Clock::now() + grace;
    }
  };

  while (running > 0) {
    const int signal_count = g_stop_signal_count;
    if (signal_count > handled_signal_count) {
      stop_signal = g_stop_signal;
      if (handled_signal_count == 0) {
        print_line("pipetrain: received " + signal_name(stop_signal) + "; forwarding it to the " +
                   count_ranks(running) + " still running");
        begin_stopping(stop_signal, options.signal_grace_period);
      } else if (!killed) {
        // Someone pressing Ctrl-C twice wants out now, not after the grace period.
        print_line("pipetrain: received " + signal_name(stop_signal) + " again; killing the " +
                   count_ranks(running) + " still running");
        signal_running(SIGKILL);
        killed = true;
      }
      handled_signal_count = signal_count;
    }

    // Rank order, so that children found dead in the same pass resolve "first" deterministically.
    for (Child& child : children) {
      if (!child.running) continue;
      int status = 0;
      pid_t reaped;
      do {
        reaped = waitpid(child.pid, &status, WNOHANG);
      } while (reaped < 0 && errno == EINTR);
      if (reaped == 0) continue;
      int code = 0;
      std::string what;
      if (reaped < 0) {
        // ECHILD: someone else reaped it (e.g. another thread's waitpid(-1)). Its outcome is
        // unknown, and an unknown outcome must not be reported as success.
        code = 1;
        what = std::string("exited, but its exit status was lost (") + std::strerror(errno) + ")";
      } else if (WIFEXITED(status)) {
        code = WEXITSTATUS(status);
        what = "failed with exit code " + std::to_string(code);
      } else if (WIFSIGNALED(status)) {
        code = 128 + WTERMSIG(status);
        what = "was killed by signal " + signal_name(WTERMSIG(status));
      } else {
        continue;  // Stopped or continued: still alive.
      }
      child.running = false;
      --running;
      // A rank ending after a signal reached the launcher (exit 143 when it saved, 137 when killed
      // for taking too long) is the signal's doing, not a failure of its own.
      if (code == 0 || first_failure != 0 || stop_signal != 0) continue;
      first_failure = code;
      if (!stopping) {
        print_line("pipetrain: rank " + std::to_string(child.rank) + " " + what +
                   "; stopping the other " + count_ranks(running) + scope);
        begin_stopping(SIGTERM, options.grace_period);
      }
    }
    if (running == 0) break;

    int timeout_ms = kMaxPollMilliseconds;
    if (stopping && !killed) {
      const auto left = kill_deadline - Clock::now();
      if (left <= Clock::duration::zero()) {
        print_line("pipetrain: " + count_ranks(running) + " still running " +
                   std::to_string(grace_period.count()) + " ms after being asked to stop; " +
                   "sending SIGKILL");
        signal_running(SIGKILL);
        killed = true;
      } else {
        const auto left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(left).count();
        timeout_ms = static_cast<int>(std::min<int64_t>(timeout_ms, left_ms + 1));
      }
    }
    signals.wait(timeout_ms);
  }
  if (first_failure != 0) return first_failure;
  // Also covers a signal that arrived before any child was started, or after the last one exited.
  if (stop_signal == 0 && g_stop_signal_count > 0) stop_signal = g_stop_signal;
  if (stop_signal != 0) return 128 + stop_signal;
  return 0;
}

std::string field(const char* name, int64_t value) {
  return std::string("LaunchOptions::") + name + "=" + std::to_string(value);
}

// A count of processes or machines: "pipetrain: <name>=<value> must be at least 1; <advice>".
void require_at_least_one(const std::string& name, int64_t value, const std::string& advice) {
  if (value < 1) {
    throw std::invalid_argument("pipetrain: " + name + "=" + std::to_string(value) +
                                " must be at least 1; " + advice);
  }
}

// Everything that can be checked before anything is started, so that a typo on one node fails
// there at once instead of leaving the other nodes waiting at the rendezvous until they time out.
void validate_options(const LaunchOptions& options) {
  require_at_least_one("LaunchOptions::nprocs", options.nprocs,
                       "set it to the number of processes to run");
  require_at_least_one("LaunchOptions::nnodes", options.nnodes,
                       "set it to the number of machines, each running one launcher");
  if (options.nprocs > std::numeric_limits<int64_t>::max() / options.nnodes) {
    throw std::invalid_argument("pipetrain: " + field("nnodes", options.nnodes) + " times " +
                                field("nprocs", options.nprocs) + " overflows the world size");
  }
  if (options.node_rank < 0 || options.node_rank >= options.nnodes) {
    throw std::invalid_argument("pipetrain: " + field("node_rank", options.node_rank) +
                                " must be in [0, nnodes=" + std::to_string(options.nnodes) +
                                "); give every node a distinct index from 0 to nnodes - 1 "
                                "(NODE_RANK), with 0 on the node whose address is MASTER_ADDR");
  }
  if (options.main_port < 0 || options.main_port > 65535) {
    throw std::invalid_argument("pipetrain: " + field("main_port", options.main_port) +
                                " is not a TCP port; use one in [1, 65535] (MASTER_PORT), or 0 "
                                "on a single node for a free one");
  }
  if (options.nnodes > 1 && options.main_address.empty()) {
    throw std::invalid_argument(
        "pipetrain: LaunchOptions::main_address (MASTER_ADDR) is empty, but with nnodes=" +
        std::to_string(options.nnodes) +
        " every node must rendezvous at the same address, which no node can guess; set it to "
        "the host name or IP address of node 0 (export MASTER_ADDR=... on every node)");
  }
  if (options.nnodes > 1 && options.main_port == 0) {
    throw std::invalid_argument(
        "pipetrain: LaunchOptions::main_port (MASTER_PORT) is 0, but with nnodes=" +
        std::to_string(options.nnodes) +
        " a port chosen on one node is unknown to the others; set it to a TCP port that is free "
        "on node 0, the same on every node (export MASTER_PORT=... on every node)");
  }
}

}  // namespace

LaunchOptions multi_node_launch_options(int64_t nprocs, int64_t nnodes,
                                        const EnvironmentVariables& env) {
  require_at_least_one("nprocs", nprocs, "pass the number of processes per node");
  require_at_least_one("nnodes", nnodes, "pass the number of machines");
  const bool multi_node = nnodes > 1;
  const std::string nodes = "nnodes=" + std::to_string(nnodes);
  LaunchOptions options;
  options.nprocs = nprocs;
  options.nnodes = nnodes;

  // NODE_RANK first, as in Lightning: it is the variable a person sets by hand, while GROUP_RANK
  // may be left over from an enclosing torchrun.
  const char* node_variable = "NODE_RANK";
  const std::string* node_value = find_variable(env, "NODE_RANK");
  if (node_value == nullptr) {
    node_variable = "GROUP_RANK";
    node_value = find_variable(env, "GROUP_RANK");
  }
  const std::string node_hint = "set NODE_RANK to this node's index in [0, " +
                                std::to_string(nnodes) +
                                "), 0 on the node whose address is MASTER_ADDR and a different "
                                "index on every other node";
  if (node_value != nullptr) {
    options.node_rank = parse_integer(node_variable, *node_value, node_hint);
    if (options.node_rank < 0 || options.node_rank >= nnodes) {
      throw std::invalid_argument("pipetrain: environment variable " + std::string(node_variable) +
                                  "=" + *node_value + " is outside [0, " + nodes + "); " +
                                  node_hint);
    }
  } else if (multi_node) {
    throw std::invalid_argument(
        "pipetrain: environment variable NODE_RANK is not set, but with " + nodes +
        " every node must know its index (two nodes both taking index 0 would hang at the "
        "rendezvous); " +
        node_hint);
  }

  const std::string address_hint =
      "set MASTER_ADDR to the host name or IP address of node 0, the same on every node";
  if (const std::string* address = find_variable(env, "MASTER_ADDR")) {
    if (address->empty()) {
      throw std::invalid_argument("pipetrain: environment variable MASTER_ADDR is set but empty; " +
                                  address_hint + (multi_node ? "" : ", or unset it"));
    }
    options.main_address = *address;
  } else if (multi_node) {
    throw std::invalid_argument(
        "pipetrain: environment variable MASTER_ADDR is not set, but with " + nodes +
        " every node must rendezvous at the same address; " + address_hint);
  }

  const std::string port_hint =
      "set MASTER_PORT to a TCP port in [1, 65535] that is free on node 0, the same on every "
      "node";
  if (const std::string* port = find_variable(env, "MASTER_PORT")) {
    options.main_port = parse_port("MASTER_PORT", *port, port_hint);
  } else if (multi_node) {
    throw std::invalid_argument(
        "pipetrain: environment variable MASTER_PORT is not set, but with " + nodes +
        " a port chosen on one node is unknown to the others; " + port_hint);
  }
  // Backstop for combinations the checks above do not name (e.g. a world size that overflows).
  validate_options(options);
  return options;
}

std::vector<std::string> current_command_line() {
  std::ifstream file("/proc/self/cmdline", std::ios::binary);
  const std::string content((std::istreambuf_iterator<char>(file)),
                            std::istreambuf_iterator<char>());
  if (!file.good() && !file.eof()) {
    throw std::runtime_error(
        "pipetrain: cannot read /proc/self/cmdline; pass LaunchOptions::argv explicitly");
  }
  std::vector<std::string> arguments;
  size_t start = 0;
  while (start < content.size()) {
    size_t end = content.find('\0', start);
    if (end == std::string::npos) end = content.size();
    arguments.push_back(content.substr(start, end - start));
    start = end + 1;
  }
  if (arguments.empty()) {
    throw std::runtime_error(
        "pipetrain: /proc/self/cmdline is empty; pass LaunchOptions::argv explicitly");
  }
  return arguments;
}

int find_free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    throw std::runtime_error(std::string("pipetrain: cannot create a TCP socket: ") +
                             std::strerror(errno) + "; set MASTER_PORT yourself");
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(0);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const int error = errno;
    close(fd);
    throw std::runtime_error(std::string("pipetrain: cannot bind a TCP socket on 127.0.0.1: ") +
                             std::strerror(error) + "; set MASTER_PORT yourself");
  }
  close(fd);
  return ntohs(address.sin_port);
}

int launch_local_processes(const LaunchOptions& options) {
  validate_options(options);
  for (const auto& [name, grace] :
       {std::pair{"grace_period", options.grace_period},
        std::pair{"signal_grace_period", options.signal_grace_period}}) {
    if (grace.count() < 0) {
      throw std::invalid_argument(std::string("pipetrain: LaunchOptions::") + name + "=" +
                                  std::to_string(grace.count()) + " ms must not be negative");
    }
  }
  const bool rerun_self = options.argv.empty();
  const std::vector<std::string> arguments = rerun_self ? current_command_line() : options.argv;

  EnvironmentVariables shared_env = current_environment();
  for (const auto& [name, value] : options.extra_env) shared_env[name] = value;
  const std::string program =
      rerun_self ? std::string("/proc/self/exe") : resolve_program(arguments[0], shared_env);
  if (shared_env.count("OMP_NUM_THREADS") == 0) {
    shared_env["OMP_NUM_THREADS"] =
        std::to_string(std::max<int64_t>(1, usable_cpus() / options.nprocs));
  }
  shared_env["MASTER_ADDR"] = options.main_address.empty() ? "127.0.0.1" : options.main_address;
  // With no port given (one node), the ranks meet in a file in a directory of their own rather
  // than at a TCP port: nothing listens on the network (Torch 1.13's TCPStore could only listen on
  // every interface), no port can be taken between choosing and listening, and only this user can
  // join. The directory is removed when the launch ends, however it ends.
  std::optional<RendezvousDirectory> rendezvous;
  if (options.main_port == 0) {
    rendezvous.emplace();
    shared_env[kRendezvousFileVariable] = rendezvous->file();
    // Left-overs of an enclosing launch would name a rendezvous this one does not use.
    for (const char* name : {"MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"}) shared_env.erase(name);
  } else {
    shared_env["MASTER_PORT"] = std::to_string(options.main_port);
    shared_env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
    shared_env.erase(kRendezvousFileVariable);
  }
  shared_env["WORLD_SIZE"] = std::to_string(options.nnodes * options.nprocs);
  shared_env["LOCAL_WORLD_SIZE"] = std::to_string(options.nprocs);
  shared_env["GROUP_RANK"] = std::to_string(options.node_rank);

  // Everything the children need is built before the first fork, since a forked child of a
  // possibly multi-threaded parent must not allocate.
  std::vector<char*> argv_pointers;
  for (const std::string& argument : arguments) {
    argv_pointers.push_back(const_cast<char*>(argument.c_str()));
  }
  argv_pointers.push_back(nullptr);
  const size_t nprocs = static_cast<size_t>(options.nprocs);
  std::vector<std::vector<std::string>> env_strings(nprocs);
  std::vector<std::vector<char*>> env_pointers(nprocs);
  // Node-major rank order, as torchrun assigns it: node k holds ranks [k * nprocs, (k+1) * nprocs),
  // so a pipeline's neighbouring stages share a machine wherever they can.
  const int64_t first_rank = options.node_rank * options.nprocs;
  for (size_t local_rank = 0; local_rank < nprocs; ++local_rank) {
    EnvironmentVariables env = shared_env;
    env["RANK"] = std::to_string(first_rank + static_cast<int64_t>(local_rank));
    env["LOCAL_RANK"] = std::to_string(local_rank);
    for (const auto& [name, value] : env) env_strings[local_rank].push_back(name + "=" + value);
    for (const std::string& entry : env_strings[local_rank]) {
      env_pointers[local_rank].push_back(const_cast<char*>(entry.c_str()));
    }
    env_pointers[local_rank].push_back(nullptr);
  }
  const std::string exec_error_prefix =
      "pipetrain: cannot execute " + program + " (" + arguments[0] + "): errno ";

  SignalScope signals;
  std::vector<Child> children;
  children.reserve(nprocs);
  ChildrenGuard guard(children);
  // Unflushed output would otherwise be interleaved unpredictably with the children's.
  std::fflush(nullptr);
  for (size_t local_rank = 0; local_rank < nprocs; ++local_rank) {
    if (g_stop_signal_count > 0) break;  // Interrupted while starting: start no more.
    const pid_t pid =
        spawn_child(program, argv_pointers, env_pointers[local_rank], exec_error_prefix);
    children.push_back({pid, first_rank + static_cast<int64_t>(local_rank), true});
  }
  return supervise(children, signals, options, options.nnodes > 1 ? " on this node" : "");
}

bool first_to_report(const std::string& message) {
  const char* store = std::getenv(kRendezvousFileVariable);
  if (store == nullptr || *store == '\0') return true;
  char name[40];
  std::snprintf(name, sizeof name, "/reported-%016zx", std::hash<std::string>{}(message));
  const std::string claim = std::filesystem::path(store).parent_path().string() + name;
  const int fd = open(claim.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd >= 0) {
    close(fd);
    return true;
  }
  return errno != EEXIST;  // where no claim can be made, say it rather than lose it
}

std::string signal_name(int signo) {
  static const std::pair<int, const char*> kNames[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"},
      {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"}};
  for (const auto& [number, name] : kNames) {
    if (number == signo) return name;
  }
  return "signal " + std::to_string(signo);
}

}  // namespace pipetrain
