// Where the ranks of a run meet before any process group exists: the c10d store that process
// groups rendezvous through, and that pipetrain keeps for small messages (the first error).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "pipetrain/cluster_environment.h"
#include "util/compat.h"

namespace pipetrain {

// Joins the rendezvous `env` describes, as rank `rank`:
// - a file (ClusterEnvironment::rendezvous_file, set by pipetrain's single-node launcher): a
//   c10d::FileStore, so nothing listens on the network;
// - a store the launcher hosts (torchrun's agent): a TCPStore client, keys under store_prefix();
// - otherwise rank 0 serves a TCPStore at main_address():main_port() and the others join it.
//   Where MASTER_ADDR is a loopback address and the Torch can be given a socket (2.x), rank 0
//   listens on that address alone; Torch 1.13's TCPStore always listens on every interface.
// Every wait in the store gives up after `timeout`. Throws std::runtime_error naming the
// rendezvous and what to check when it cannot be joined.
StorePtr join_rendezvous(const ClusterEnvironment& env, int64_t rank,
                         std::chrono::milliseconds timeout);

// Bounds each receive and send on this process's connections to TCP port `port` (the store's) by
// `timeout`. join_rendezvous sets the run's timeout; the error exchange a shorter one.
void limit_store_waits(int port, std::chrono::milliseconds timeout);

// The rendezvous as messages name it: "HOST:PORT" or "file PATH".
std::string describe_rendezvous(const ClusterEnvironment& env);

// Whether `address` names this machine's loopback interface ("localhost", 127.x.y.z, "::1").
bool is_loopback_address(const std::string& address);

}  // namespace pipetrain
