// Starts one process per pipeline stage on this machine when nothing else did. pipetrain is SPMD
// like torchrun: every stage runs the same program and learns its rank from environment
// variables. So that `pipetrain train --nprocs 4 ...` works without torchrun or srun, the program
// re-executes itself N times with torchrun's variables set and the original process only waits,
// stops the others as soon as one stage fails (a pipeline cannot make progress without every
// stage, and the survivors would otherwise block in communication forever), and reports the
// first failure's exit code. Deliberately free of LibTorch: the parent should not initialise
// CUDA or thread pools before forking.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/cluster_environment.h"

namespace pipetrain {

struct LaunchOptions {
  // Number of child processes (ranks), at least 1.
  int64_t nprocs = 1;
  // Program and arguments of every child. Empty: this process's own command line, executed
  // through /proc/self/exe so that the very same binary runs even if PATH or the file changed.
  // Otherwise argv[0] is looked up in PATH (of the children's environment) like execvp.
  std::vector<std::string> argv;
  // Added to every child's environment (overriding inherited values, but not the rank
  // variables the launcher sets).
  EnvironmentVariables extra_env;
  // After one child fails (or the parent is asked to stop), how long the others get between
  // SIGTERM and SIGKILL to flush logs and checkpoints.
  std::chrono::milliseconds grace_period{5000};
};

// Runs `options.nprocs` copies of the program on this machine and waits for all of them.
//
// Every child gets the current environment plus options.extra_env plus torchrun's variables:
// MASTER_ADDR=127.0.0.1, MASTER_PORT=<free port>, RANK=i, WORLD_SIZE=n, LOCAL_RANK=i,
// LOCAL_WORLD_SIZE=n, GROUP_RANK=0, and OMP_NUM_THREADS=max(1, usable CPUs / n) unless it is
// already set (so that n processes do not each start a thread per core). Children inherit
// stdout/stderr and die with the parent (PR_SET_PDEATHSIG). SIGINT/SIGTERM received by the parent
// are forwarded to the children; a second one kills them at once.
//
// When a child exits non-zero or is killed by a signal, prints one line to stderr, e.g.
// "pipetrain: rank 1 failed with exit code 3; stopping the other 3 ranks", sends SIGTERM to the
// ranks still running and SIGKILL after grace_period. Returns 0 if every child exited 0, else the
// exit code of the first child seen to fail (128 + signal number for a signal; children reaped in
// the same pass are examined in rank order), else 128 + signal number if the parent was
// interrupted.
//
// Installs its own SIGCHLD/SIGINT/SIGTERM handlers for the duration of the call and restores the
// previous ones before returning; only one call may run at a time in a process. Throws
// std::invalid_argument for bad options and std::runtime_error if the program cannot be found or
// a process cannot be created (after stopping any children already started).
int launch_local_processes(const LaunchOptions& options);

// This process's argv, read from /proc/self/cmdline. Throws std::runtime_error if unreadable.
std::vector<std::string> current_command_line();

// A TCP port that was free on 127.0.0.1 a moment ago (bind to port 0, read it back, close).
// Another process may take it before it is used again; torchrun accepts the same race.
// Throws std::runtime_error if no socket can be bound.
int find_free_port();

}  // namespace pipetrain
