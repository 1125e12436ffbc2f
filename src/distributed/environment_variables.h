// Strict reading of launcher environment variables, shared by the cluster environments and the
// local launcher so that both reject the same typos with the same words.
#pragma once

#include <cstdint>
#include <string>

#include "pipetrain/cluster_environment.h"

namespace pipetrain {

// Where pipetrain's single-node launcher tells its ranks to meet (a file, instead of a TCP port).
constexpr char kRendezvousFileVariable[] = "PIPETRAIN_RENDEZVOUS_FILE";

// The value of `name` in `env`, or nullptr.
const std::string* find_variable(const EnvironmentVariables& env, const std::string& name);

// The whole value must be a base-10 integer: "8 " or "0x8" are rejected rather than guessed at,
// since a launcher never produces them and a person who typed them made a mistake. Throws
// std::invalid_argument naming the variable, its value and `hint`.
int64_t parse_integer(const std::string& name, const std::string& value, const std::string& hint);

// A TCP port in [1, 65535]; throws std::invalid_argument like parse_integer otherwise.
int parse_port(const std::string& name, const std::string& value, const std::string& hint);

}  // namespace pipetrain
