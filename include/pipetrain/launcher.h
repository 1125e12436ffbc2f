// Starts one process per pipeline stage on this machine when nothing else did. pipetrain is SPMD
// like torchrun: every stage runs the same program and learns its rank from environment
// variables. So that `pipetrain train --nprocs 4 ...` works without torchrun or srun, the program
// re-executes itself N times with torchrun's variables set and the original process only waits,
// stops the others as soon as one stage fails (a pipeline cannot make progress without every
// stage, and the survivors would otherwise block in communication forever), and reports the
// first failure's exit code. Several machines work like Lightning's manual multi-node launch:
// the same command is started once per node with NODE_RANK, MASTER_ADDR and MASTER_PORT set, and
// each node's launcher starts its own block of ranks; launchers never talk to each other, the
// ranks meet at the rendezvous. Deliberately free of LibTorch: the parent should not initialise
// CUDA or thread pools before forking.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/cluster_environment.h"

namespace pipetrain {

struct LaunchOptions {
  // Number of child processes (ranks) on this machine, at least 1.
  int64_t nprocs = 1;
  // Number of machines, each running its own launcher with the same nprocs, at least 1.
  int64_t nnodes = 1;
  // This machine's index in [0, nnodes); its ranks are node_rank * nprocs + [0, nprocs).
  int64_t node_rank = 0;
  // Host (name or IP address) and TCP port of the rank-0 rendezvous, the same on every node.
  // Empty means 127.0.0.1; port 0 means a single node whose ranks meet in a file store instead
  // (PIPETRAIN_RENDEZVOUS_FILE): with nnodes > 1 every node must be told the same address and
  // port, since no node can find out what another one picked.
  std::string main_address;
  int main_port = 0;
  // Program and arguments of every child. Empty: this process's own command line, executed
  // through /proc/self/exe so that the very same binary runs even if PATH or the file changed.
  // Otherwise argv[0] is looked up in PATH (of the children's environment) like execvp.
  std::vector<std::string> argv;
  // Added to every child's environment (overriding inherited values, but not the rank
  // variables the launcher sets).
  EnvironmentVariables extra_env;
  // After one child fails, how long the others get between SIGTERM and SIGKILL to flush logs.
  std::chrono::milliseconds grace_period{5000};
  // After this process receives SIGINT, SIGTERM or SIGUSR1 (forwarded to the children, which
  // finish their step and save last.ckpt), how long they get before SIGKILL; launch_ranks makes
  // it TrainerOptions::timeout_seconds. A second signal kills them at once.
  std::chrono::milliseconds signal_grace_period{300000};
};

// Runs `options.nprocs` copies of the program on this machine and waits for all of them.
//
// Every child gets the current environment plus options.extra_env plus torchrun's variables:
// MASTER_ADDR=main_address (default 127.0.0.1), MASTER_PORT=main_port and
// TORCHELASTIC_USE_AGENT_STORE=False; with main_port 0, instead of a port,
// PIPETRAIN_RENDEZVOUS_FILE=<a file in a fresh directory of mode 0700 under $TMPDIR or /tmp>,
// removed when the call returns;
// RANK=node_rank*nprocs+i, WORLD_SIZE=nnodes*nprocs, LOCAL_RANK=i, LOCAL_WORLD_SIZE=nprocs,
// GROUP_RANK=node_rank, and OMP_NUM_THREADS=max(1, usable CPUs / nprocs) unless it is already set
// (so that nprocs processes do not each start a thread per core). Children inherit stdout/stderr
// and die with the parent (PR_SET_PDEATHSIG). SIGINT/SIGTERM/SIGUSR1 received by the parent are
// forwarded to the children, which are killed signal_grace_period later if still running; a second
// one kills them at once.
//
// When a child exits non-zero or is killed by a signal, prints one line to stderr, e.g.
// "pipetrain: rank 1 failed with exit code 3; stopping the other 3 ranks" (the global rank; with
// nnodes > 1 the line ends in "on this node", because the other nodes' launchers are not told:
// their ranks fail on their own once the rendezvous or a collective breaks), sends SIGTERM to the
// ranks still running and SIGKILL after grace_period. Returns 0 if every child exited 0, else the
// exit code of the first child seen to fail before any signal reached the parent (128 + signal
// number for a signal; children reaped in the same pass are examined in rank order), else 128 +
// the number of the signal that interrupted the parent (143 for SIGTERM, what a scheduler reads as
// "requeue"), however its children ended.
//
// Installs its own SIGCHLD/SIGINT/SIGTERM handlers for the duration of the call and restores the
// previous ones before returning; only one call may run at a time in a process. Throws
// std::invalid_argument for bad options (nprocs or nnodes < 1, node_rank outside [0, nnodes), a
// port outside [0, 65535], or nnodes > 1 without main_address and main_port) and
// std::runtime_error if the program cannot be found or a process cannot be created (after
// stopping any children already started).
int launch_local_processes(const LaunchOptions& options);

// Options for Lightning's manual multi-node launch, where the same command is started once per
// node: the node's index comes from NODE_RANK (or GROUP_RANK, torchrun's name, when NODE_RANK is
// unset) and the rendezvous from MASTER_ADDR and MASTER_PORT in `env`. With nnodes > 1 all three
// are required; with nnodes == 1 none is (the node index must then be 0, and an unset address or
// port is left empty / 0 for the launcher to choose). Only the layout and rendezvous fields are
// filled; argv, extra_env and grace_period keep their defaults. A pure function of its arguments.
// Throws std::invalid_argument naming the variable, its value and what to set, for a missing or
// malformed value, a node index outside [0, nnodes), or nprocs / nnodes below 1.
LaunchOptions multi_node_launch_options(int64_t nprocs, int64_t nnodes,
                                        const EnvironmentVariables& env);

// This process's argv, read from /proc/self/cmdline. Throws std::runtime_error if unreadable.
std::vector<std::string> current_command_line();

// A TCP port that was free on 127.0.0.1 a moment ago (bind to port 0, read it back, close).
// Another process may take it before it is used again (the launcher itself never relies on
// this: with no port given its ranks meet in a file).
// Throws std::runtime_error if no socket can be bound.
int find_free_port();

// Whether this process is the first of its launch to report `message`: every rank of a launch
// that meets the same error (a refusal all ranks agree on) would print the same line, and the
// first to claim it prints it for all. Claims are files in the rendezvous directory of
// launch_local_processes on one node; outside one (torchrun, SLURM, several nodes) always true.
bool first_to_report(const std::string& message);

// "SIGTERM" for SIGTERM's number: names say more than numbers, which differ between
// architectures.
std::string signal_name(int signo);

}  // namespace pipetrain
