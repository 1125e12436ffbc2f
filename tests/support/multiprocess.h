// Tests that need several ranks re-run their own binary once per rank, through pipetrain's local
// launcher, with PIPETRAIN_TEST_WORKER naming the function each copy runs instead of the tests.
#pragma once

#include <functional>
#include <map>
#include <string>

namespace pipetrain::testing {

using Worker = std::function<void()>;

struct WorkerRegistrar {
  WorkerRegistrar(const std::string& name, Worker worker);
};

// Runs worker `name` as ranks 0..nprocs-1 of one world; returns the launcher's exit code.
int run_ranks(int nprocs, const std::string& name,
              const std::map<std::string, std::string>& env = {});

// The value of environment variable `name`, or `fallback`.
std::string env_or(const char* name, const std::string& fallback);

// A fresh directory under the system temp dir.
std::string make_temp_dir(const std::string& prefix);

}  // namespace pipetrain::testing

#define PIPETRAIN_CONCAT_INNER(a, b) a##b
#define PIPETRAIN_CONCAT(a, b) PIPETRAIN_CONCAT_INNER(a, b)
// Defines a worker function that run_ranks() can start by name.
#define PIPETRAIN_WORKER(name)                                                                  \
  static void name();                                                                           \
  static ::pipetrain::testing::WorkerRegistrar PIPETRAIN_CONCAT(name, _registrar)(#name, name); \
  static void name()
