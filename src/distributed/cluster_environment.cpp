// Reads launcher environment variables (torchrun, srun, or none) into a validated rank layout.
// A mistyped or inconsistent variable otherwise surfaces much later as a rendezvous that hangs
// until timeout, so everything is parsed eagerly here and every error names the variable, its
// value and what to change.
#include "pipetrain/cluster_environment.h"

#include <cctype>
#include <charconv>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "environment_variables.h"

extern char** environ;

namespace pipetrain {

const std::string* find_variable(const EnvironmentVariables& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

int64_t parse_integer(const std::string& name, const std::string& value, const std::string& hint) {
  int64_t result = 0;
  const char* begin = value.data();
  const char* end = value.data() + value.size();
  auto [ptr, error] = std::from_chars(begin, end, result);
  if (value.empty() || error != std::errc() || ptr != end) {
    throw std::invalid_argument("pipetrain: environment variable " + name + "='" + value +
                                "' is not an integer; " + hint);
  }
  return result;
}

int parse_port(const std::string& name, const std::string& value, const std::string& hint) {
  const int64_t port = parse_integer(name, value, hint);
  if (port < 1 || port > 65535) {
    throw std::invalid_argument("pipetrain: environment variable " + name + "=" + value +
                                " is not a valid port; " + hint);
  }
  return static_cast<int>(port);
}

namespace {

bool has_variable(const EnvironmentVariables& env, const std::string& name) {
  return env.count(name) != 0;
}

const std::string& required_string(const EnvironmentVariables& env, const std::string& name,
                                   const std::string& hint) {
  const std::string* value = find_variable(env, name);
  if (value == nullptr) {
    throw std::invalid_argument("pipetrain: environment variable " + name + " is not set; " + hint);
  }
  return *value;
}

int64_t required_integer(const EnvironmentVariables& env, const std::string& name,
                         const std::string& hint) {
  return parse_integer(name, required_string(env, name, hint), hint);
}

int64_t optional_integer(const EnvironmentVariables& env, const std::string& name, int64_t fallback,
                         const std::string& hint) {
  const std::string* value = find_variable(env, name);
  return value == nullptr ? fallback : parse_integer(name, *value, hint);
}

int parse_master_port(const std::string& name, const std::string& value) {
  return parse_port(name, value,
                    "set " + name + " to a TCP port in [1, 65535] that is free on the " +
                        "rank-0 host and the same for every process");
}

std::string nonempty_address(const std::string& name, const std::string& value) {
  if (value.empty()) {
    throw std::invalid_argument("pipetrain: environment variable " + name +
                                " is set but empty; set it to the host name or IP address of "
                                "the rank-0 process, or unset it");
  }
  return value;
}

// Spelling of each quantity in the environment that produced it, so that a consistency error
// points at the variables the user can actually fix.
struct RankVariableNames {
  std::string world_size;
  std::string global_rank;
  std::string local_rank;
  std::string local_world_size;
  std::string node_rank;
};

std::string assignment(const std::string& name, int64_t value) {
  return name + "=" + std::to_string(value);
}

void validate_ranks(const RankVariableNames& names, const detail::RankLayout& layout) {
  if (layout.world_size < 1) {
    throw std::invalid_argument("pipetrain: " + assignment(names.world_size, layout.world_size) +
                                " must be at least 1; set it to the total number of processes");
  }
  if (layout.global_rank < 0 || layout.global_rank >= layout.world_size) {
    throw std::invalid_argument("pipetrain: " + assignment(names.global_rank, layout.global_rank) +
                                " must be in [0, " +
                                assignment(names.world_size, layout.world_size) +
                                "); every process needs a distinct rank below the world size");
  }
  if (layout.local_world_size < 1 || layout.local_world_size > layout.world_size) {
    throw std::invalid_argument(
        "pipetrain: " + assignment(names.local_world_size, layout.local_world_size) +
        " must be in [1, " + assignment(names.world_size, layout.world_size) +
        "]; set it to the number of processes on this node");
  }
  if (layout.local_rank < 0 || layout.local_rank >= layout.local_world_size) {
    throw std::invalid_argument("pipetrain: " + assignment(names.local_rank, layout.local_rank) +
                                " must be in [0, " +
                                assignment(names.local_world_size, layout.local_world_size) +
                                "); set it to this process's index among the processes on its "
                                "node");
  }
  if (layout.node_rank < 0) {
    throw std::invalid_argument("pipetrain: " + assignment(names.node_rank, layout.node_rank) +
                                " must not be negative; set it to this node's index");
  }
}

// Expands SLURM's compressed per-node task counts, "4(x2),3" -> {4, 4, 3}.
std::vector<int64_t> expand_tasks_per_node(const std::string& name, const std::string& value) {
  const std::string hint = "expected a count per node like '4' or '4(x2),3'";
  std::vector<int64_t> counts;
  size_t start = 0;
  while (start <= value.size()) {
    size_t comma = value.find(',', start);
    if (comma == std::string::npos) comma = value.size();
    const std::string item = value.substr(start, comma - start);
    int64_t repeat = 1;
    std::string count_text = item;
    const size_t paren = item.find("(x");
    if (paren != std::string::npos) {
      if (item.back() != ')') {
        throw std::invalid_argument("pipetrain: environment variable " + name + "='" + value +
                                    "' has a malformed entry '" + item + "'; " + hint);
      }
      count_text = item.substr(0, paren);
      repeat = parse_integer(name, item.substr(paren + 2, item.size() - paren - 3), hint);
    }
    const int64_t count = parse_integer(name, count_text, hint);
    if (count < 1 || repeat < 1) {
      throw std::invalid_argument("pipetrain: environment variable " + name + "='" + value +
                                  "' has a non-positive entry '" + item + "'; " + hint);
    }
    counts.insert(counts.end(), static_cast<size_t>(repeat), count);
    start = comma + 1;
  }
  return counts;
}

}  // namespace

EnvironmentVariables current_environment() {
  EnvironmentVariables env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string text(*entry);
    const size_t equals = text.find('=');
    // Entries without '=' are not variables (execve permits them); nothing could look them up.
    if (equals == std::string::npos) continue;
    env.emplace(text.substr(0, equals), text.substr(equals + 1));
  }
  return env;
}

// ---------------------------------------------------------------------------------------------
// torchelastic

bool TorchElasticEnvironment::detect(const EnvironmentVariables& env) {
  return has_variable(env, "RANK") && has_variable(env, "WORLD_SIZE") &&
         has_variable(env, "MASTER_ADDR") &&
         (has_variable(env, "MASTER_PORT") || has_variable(env, kRendezvousFileVariable));
}

TorchElasticEnvironment::TorchElasticEnvironment(const EnvironmentVariables& env) {
  const std::string hint =
      "torchrun sets it; when launching by hand, set it to a non-negative "
      "integer";
  layout_.main_address = nonempty_address(
      "MASTER_ADDR",
      required_string(env, "MASTER_ADDR", "set it to the host of the rank-0 process"));
  if (const std::string* file = find_variable(env, kRendezvousFileVariable)) {
    if (file->empty()) {
      throw std::invalid_argument(std::string(kRendezvousFileVariable) +
                                  " is set but empty (pipetrain's launcher sets it to a file "
                                  "path); unset it to meet at MASTER_ADDR:MASTER_PORT instead");
    }
    rendezvous_file_ = *file;
  } else {
    layout_.main_port =
        parse_master_port("MASTER_PORT", required_string(env, "MASTER_PORT",
                                                         "set it to the rendezvous port of the "
                                                         "rank-0 process"));
  }
  layout_.world_size = required_integer(env, "WORLD_SIZE", hint);
  layout_.global_rank = required_integer(env, "RANK", hint);
  layout_.local_rank = optional_integer(env, "LOCAL_RANK", layout_.global_rank, hint);
  layout_.local_world_size = optional_integer(env, "LOCAL_WORLD_SIZE", layout_.world_size, hint);
  layout_.node_rank = optional_integer(env, "GROUP_RANK", 0, hint);
  validate_ranks({"WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"}, layout_);
  if (const std::string* agent_store = find_variable(env, "TORCHELASTIC_USE_AGENT_STORE")) {
    if (*agent_store != "True" && *agent_store != "False") {
      throw std::invalid_argument("TORCHELASTIC_USE_AGENT_STORE='" + *agent_store +
                                  "' is neither True nor False (torchrun sets it)");
    }
    launcher_hosts_store_ = *agent_store == "True";
  }
  restart_count_ = optional_integer(env, "TORCHELASTIC_RESTART_COUNT", 0, hint);
}

// ---------------------------------------------------------------------------------------------
// SLURM

bool SLURMEnvironment::detect(const EnvironmentVariables& env) {
  if (!has_variable(env, "SLURM_NTASKS") || !has_variable(env, "SLURM_PROCID")) return false;
  const std::string* job_name = find_variable(env, "SLURM_JOB_NAME");
  return job_name == nullptr || (*job_name != "bash" && *job_name != "interactive");
}

std::string SLURMEnvironment::first_host(const std::string& nodelist) {
  const std::string advice =
      "; set MASTER_ADDR to the address of the first node to bypass node list parsing";
  size_t i = 0;
  while (i < nodelist.size() && std::isspace(static_cast<unsigned char>(nodelist[i]))) ++i;
  std::string host;
  while (i < nodelist.size()) {
    const char c = nodelist[i];
    if (c == ',' || std::isspace(static_cast<unsigned char>(c))) break;
    if (c == ']') {
      throw std::invalid_argument("pipetrain: SLURM_NODELIST='" + nodelist +
                                  "' has a ']' without a matching '['" + advice);
    }
    if (c != '[') {
      host += c;
      ++i;
      continue;
    }
    // A bracket holds ranges and single values, "01-04,07": the first host uses the first
    // value, keeping its zero padding because it is part of the host name.
    const size_t close = nodelist.find(']', i);
    const std::string inner =
        close == std::string::npos ? std::string() : nodelist.substr(i + 1, close - i - 1);
    const std::string first = inner.substr(0, inner.find_first_of(",-"));
    if (close == std::string::npos || first.empty() || inner.find('[') != std::string::npos) {
      throw std::invalid_argument("pipetrain: SLURM_NODELIST='" + nodelist +
                                  "' has a malformed '[...]' range" + advice);
    }
    host += first;
    i = close + 1;
  }
  if (host.empty()) {
    throw std::invalid_argument("pipetrain: SLURM_NODELIST='" + nodelist +
                                "' does not start with a host name" + advice);
  }
  return host;
}

SLURMEnvironment::SLURMEnvironment(const EnvironmentVariables& env) {
  const std::string hint = "srun sets it for every task; launch the processes with srun";
  layout_.world_size = required_integer(env, "SLURM_NTASKS", hint);
  layout_.global_rank = required_integer(env, "SLURM_PROCID", hint);
  layout_.local_rank = required_integer(env, "SLURM_LOCALID", hint);
  layout_.node_rank = required_integer(env, "SLURM_NODEID", hint);

  std::string local_world_size_name = "SLURM_NTASKS_PER_NODE";
  if (const std::string* per_node = find_variable(env, "SLURM_NTASKS_PER_NODE")) {
    const std::vector<int64_t> counts = expand_tasks_per_node(local_world_size_name, *per_node);
    // One uncompressed value applies to every node; a list has one entry per node.
    if (counts.size() == 1) {
      layout_.local_world_size = counts.front();
    } else if (layout_.node_rank >= 0 && layout_.node_rank < static_cast<int64_t>(counts.size())) {
      layout_.local_world_size = counts[static_cast<size_t>(layout_.node_rank)];
    } else {
      throw std::invalid_argument("pipetrain: SLURM_NODEID=" + std::to_string(layout_.node_rank) +
                                  " has no entry in SLURM_NTASKS_PER_NODE='" + *per_node +
                                  "'; the two must describe the same allocation");
    }
  } else {
    local_world_size_name = "SLURM_NTASKS/SLURM_NNODES";
    const int64_t nodes = optional_integer(env, "SLURM_NNODES", 1, hint);
    if (nodes < 1 || layout_.world_size % nodes != 0) {
      throw std::invalid_argument(
          "pipetrain: SLURM_NTASKS=" + std::to_string(layout_.world_size) +
          " cannot be split evenly over SLURM_NNODES=" + std::to_string(nodes) +
          "; request the tasks with --ntasks-per-node so that each node's count is known");
    }
    layout_.local_world_size = layout_.world_size / nodes;
  }
  validate_ranks(
      {"SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", local_world_size_name, "SLURM_NODEID"},
      layout_);

  if (const std::string* address = find_variable(env, "MASTER_ADDR")) {
    layout_.main_address = nonempty_address("MASTER_ADDR", *address);
  } else if (const std::string* nodes = find_variable(env, "SLURM_NODELIST")) {
    layout_.main_address = first_host(*nodes);
  } else if (const std::string* job_nodes = find_variable(env, "SLURM_JOB_NODELIST")) {
    layout_.main_address = first_host(*job_nodes);
  } else {
    layout_.main_address = "127.0.0.1";
  }

  if (const std::string* port = find_variable(env, "MASTER_PORT")) {
    layout_.main_port = parse_master_port("MASTER_PORT", *port);
  } else if (const std::string* job_id = find_variable(env, "SLURM_JOB_ID")) {
    // All tasks of a job see the same job id, so they agree on the port without communicating;
    // different jobs sharing a node mostly get different ports. The range 15000-24999 is below
    // Linux's ephemeral ports (32768+), so outgoing connections do not take it first.
    bool digits = !job_id->empty();
    for (char c : *job_id) digits = digits && std::isdigit(static_cast<unsigned char>(c));
    if (!digits) {
      throw std::invalid_argument("pipetrain: environment variable SLURM_JOB_ID='" + *job_id +
                                  "' is not a number, so no port can be derived from it; set "
                                  "MASTER_PORT to a free TCP port instead");
    }
    const std::string last_digits = job_id->substr(job_id->size() > 4 ? job_id->size() - 4 : 0);
    layout_.main_port = 15000 + std::stoi(last_digits);
  } else {
    layout_.main_port = 12910;  // Lightning's default when SLURM gives no job id.
  }
}

// ---------------------------------------------------------------------------------------------
// local

LocalEnvironment::LocalEnvironment(const EnvironmentVariables& /*env*/) {
  layout_.main_address = "127.0.0.1";  // the rest: RankLayout's defaults, rank 0 of 1, no port
}

bool LocalEnvironment::detect(const EnvironmentVariables& /*env*/) { return true; }

std::unique_ptr<ClusterEnvironment> select_cluster_environment(const EnvironmentVariables& env) {
  if (TorchElasticEnvironment::detect(env)) {
    return std::make_unique<TorchElasticEnvironment>(env);
  }
  if (SLURMEnvironment::detect(env)) {
    return std::make_unique<SLURMEnvironment>(env);
  }
  return std::make_unique<LocalEnvironment>(env);
}

}  // namespace pipetrain
