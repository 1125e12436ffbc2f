// Where a pipeline stage learns who it is. Every stage runs as its own process, and something
// outside pipetrain (torchrun, srun, or pipetrain's own local launcher) decides how many there
// are and which one this is. This header turns that launcher's environment variables into one
// validated answer, following the shape of PyTorch Lightning's ClusterEnvironment so that jobs
// move between torchrun and SLURM without code changes. It deliberately does not depend on
// LibTorch: it is needed before any process group exists and must stay cheap to compile and test.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace pipetrain {

// Environment variables as name -> value. Passed around explicitly (instead of calling getenv)
// so that detection is a pure function of its input and can be tested without touching environ.
using EnvironmentVariables = std::map<std::string, std::string>;

// A snapshot of this process's environ.
EnvironmentVariables current_environment();

// Rank and rendezvous information of the current process. Implementations read and validate
// everything in their constructor, so an object that exists is consistent:
// 1 <= world_size, 0 <= global_rank < world_size, 0 <= local_rank < local_world_size,
// local_world_size <= world_size, 0 <= node_rank.
class ClusterEnvironment {
 public:
  virtual ~ClusterEnvironment() = default;
  // "torchelastic", "slurm" or "local"; meant for log lines.
  virtual std::string name() const = 0;
  // Host and port of the rank-0 rendezvous (the TCPStore that process groups are built on).
  virtual std::string main_address() const = 0;
  virtual int main_port() const = 0;
  virtual int64_t world_size() const = 0;
  virtual int64_t global_rank() const = 0;
  // Rank among the processes on this machine; used to pick the device.
  virtual int64_t local_rank() const = 0;
  virtual int64_t local_world_size() const = 0;
  virtual int64_t node_rank() const = 0;
  // Whether the launcher hosts the rendezvous store at main_address():main_port() (torchrun's
  // agent does, and so does pipetrain's own launcher), so rank 0 joins it like every other rank
  // instead of listening there itself.
  virtual bool launcher_hosts_store() const { return false; }
  // The prefix of this run's keys in a launcher-hosted store, which outlives restarts.
  virtual std::string store_prefix() const { return ""; }
  // A file that replaces the TCP rendezvous when every rank runs on this machine, or "" for none.
  // pipetrain's own single-node launcher sets it (PIPETRAIN_RENDEZVOUS_FILE), so that nothing of
  // the rendezvous listens on the network: Torch 1.13's TCPStore can only listen on every
  // interface, and the file, in a directory only this user can enter, keeps other users out too.
  virtual std::string rendezvous_file() const { return ""; }
};

namespace detail {

// What pipetrain's own environments below share, not an interface: an environment of one's own
// derives from ClusterEnvironment and validates in its constructor, as they do.

// Where this process stands among the ranks and where they meet: the answers of a
// ClusterEnvironment's rank getters, as one value.
struct RankLayout {
  std::string main_address;
  int main_port = 0;
  int64_t world_size = 1;
  int64_t global_rank = 0;
  int64_t local_rank = 0;
  int64_t local_world_size = 1;
  int64_t node_rank = 0;
};

// An environment whose constructor reads the launcher's variables into layout_ once, and
// validates them; the getters answer from it.
class RankLayoutEnvironment : public ClusterEnvironment {
 public:
  std::string main_address() const override { return layout_.main_address; }
  int main_port() const override { return layout_.main_port; }
  int64_t world_size() const override { return layout_.world_size; }
  int64_t global_rank() const override { return layout_.global_rank; }
  int64_t local_rank() const override { return layout_.local_rank; }
  int64_t local_world_size() const override { return layout_.local_world_size; }
  int64_t node_rank() const override { return layout_.node_rank; }

 protected:
  RankLayout layout_;
};

}  // namespace detail

// Processes started by torchrun (torch.distributed.elastic) or by pipetrain's own launcher,
// which sets the same variables: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, and TORCHELASTIC_USE_AGENT_STORE=True when the launcher hosts
// the store (keys then go under /worker/attempt_<TORCHELASTIC_RESTART_COUNT>/, as
// torch.distributed's env:// rendezvous puts them). A hand-written launch that sets only the four
// detection variables is treated as a single node: LOCAL_RANK defaults to RANK, LOCAL_WORLD_SIZE to
// WORLD_SIZE and GROUP_RANK to 0. PIPETRAIN_RENDEZVOUS_FILE (set by pipetrain's single-node
// launcher) stands in for MASTER_PORT: the ranks then meet in that file instead of a TCPStore.
class TorchElasticEnvironment final : public detail::RankLayoutEnvironment {
 public:
  // Throws std::invalid_argument naming the variable when a value is missing or malformed.
  explicit TorchElasticEnvironment(const EnvironmentVariables& env);
  // True when RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (or PIPETRAIN_RENDEZVOUS_FILE) are set.
  static bool detect(const EnvironmentVariables& env);

  std::string name() const override { return "torchelastic"; }
  bool launcher_hosts_store() const override { return launcher_hosts_store_; }
  std::string store_prefix() const override {
    return "/worker/attempt_" + std::to_string(restart_count_);
  }
  std::string rendezvous_file() const override { return rendezvous_file_; }

 private:
  bool launcher_hosts_store_ = false;
  int64_t restart_count_ = 0;
  std::string rendezvous_file_;
};

// Processes started by `srun`. Ranks come from SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and
// SLURM_NODEID. The rendezvous address is MASTER_ADDR if set, else the first host of
// SLURM_NODELIST (SLURM_JOB_NODELIST as a fallback). The port is MASTER_PORT if set, else
// 15000 + the last four digits of SLURM_JOB_ID, so that every task of a job derives the same port
// without talking to the others (Lightning's rule). local_world_size comes from
// SLURM_NTASKS_PER_NODE (plain "4" or compressed "4(x2),3"), else SLURM_NTASKS / SLURM_NNODES.
class SLURMEnvironment final : public detail::RankLayoutEnvironment {
 public:
  // Throws std::invalid_argument naming the variable when a value is missing or malformed.
  explicit SLURMEnvironment(const EnvironmentVariables& env);
  // True when SLURM_NTASKS and SLURM_PROCID are set and SLURM_JOB_NAME is neither "bash" nor
  // "interactive": those names mark an salloc/srun --pty shell in which the user starts
  // processes some other way (Lightning's convention), so its SLURM variables describe the shell,
  // not the training processes.
  static bool detect(const EnvironmentVariables& env);

  // First host of a SLURM node list in compressed hostlist form:
  // "node[01-04,07],gpu7" -> "node01", "a-b[9-11]" -> "a-b9", "host" -> "host".
  // Throws std::invalid_argument for an empty list or an unbalanced bracket.
  static std::string first_host(const std::string& nodelist);

  std::string name() const override { return "slurm"; }
};

// A single process that nobody launched: rank 0 of 1 on 127.0.0.1. Port 0 means "none chosen";
// a world of one needs no rendezvous.
class LocalEnvironment final : public detail::RankLayoutEnvironment {
 public:
  explicit LocalEnvironment(const EnvironmentVariables& env = {});
  // Always true: this is the fallback.
  static bool detect(const EnvironmentVariables& env);

  std::string name() const override { return "local"; }
};

// The environment of the current process: torchelastic if detected, else slurm, else local.
// torchelastic goes first because torchrun is often run inside a SLURM allocation, and then its
// variables, not SLURM's, describe the training processes. Throws std::invalid_argument (naming
// the variable and its value) when the detected environment is malformed.
std::unique_ptr<ClusterEnvironment> select_cluster_environment(
    const EnvironmentVariables& env = current_environment());

}  // namespace pipetrain
