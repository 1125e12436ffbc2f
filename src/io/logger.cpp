#include "pipetrain/logger.h"

#include <filesystem>

namespace pipetrain {
namespace fs = std::filesystem;

int64_t claim_log_version(const std::string& root_dir, const std::string& name) {
  const fs::path base = fs::path(root_dir) / name;
  fs::create_directories(base);
  int64_t version = 0;
  // create_directory is false where the directory was there already: another run's.
  while (!fs::create_directory(base / ("version_" + std::to_string(version)))) ++version;
  return version;
}

std::string make_log_dir(const std::string& root_dir, const std::string& name, int64_t version) {
  const fs::path dir = fs::path(root_dir) / name / ("version_" + std::to_string(version));
  fs::create_directories(dir);
  return dir.string();
}

}  // namespace pipetrain
