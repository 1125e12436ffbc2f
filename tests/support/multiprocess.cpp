#include "support/multiprocess.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <random>

#include "pipetrain/error.h"
#include "pipetrain/launcher.h"

namespace pipetrain::testing {
namespace {

std::map<std::string, Worker>& workers() {
  static std::map<std::string, Worker> table;
  return table;
}

constexpr const char* kWorkerVariable = "PIPETRAIN_TEST_WORKER";

}  // namespace

WorkerRegistrar::WorkerRegistrar(const std::string& name, Worker worker) {
  workers()[name] = std::move(worker);
}

int run_ranks(int nprocs, const std::string& name, const std::map<std::string, std::string>& env) {
  LaunchOptions options;
  options.nprocs = nprocs;
  options.extra_env = EnvironmentVariables(env.begin(), env.end());
  options.extra_env[kWorkerVariable] = name;
  return launch_local_processes(options);
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value ? value : fallback;
}

std::string make_temp_dir(const std::string& prefix) {
  std::random_device random;
  const auto dir = std::filesystem::temp_directory_path() /
                   (prefix + "-" + std::to_string(random()) + std::to_string(random()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace pipetrain::testing

int main(int argc, char** argv) {
  using namespace pipetrain::testing;
  if (const char* name = std::getenv(kWorkerVariable)) {
    const auto it = workers().find(name);
    if (it == workers().end()) {
      std::cerr << "no test worker named " << name << std::endl;
      return 2;
    }
    try {
      it->second();
      return 0;
    } catch (const std::exception& e) {
      std::cerr << "worker " << name << " rank " << env_or("RANK", "?")
                << " failed: " << pipetrain::error_message(e) << std::endl;
      return 1;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
