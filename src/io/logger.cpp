#include "pipetrain/logger.h"

#include <filesystem>

namespace pipetrain {
namespace fs = std::filesystem;

int64_t next_log_version(const std::string& root_dir, const std::string& name) {
  const fs::path base = fs::path(root_dir) / name;
  int64_t version = 0;
  while (fs::exists(base / ("version_" + std::to_string(version)))) ++version;
  return version;
}

std::string make_log_dir(const std::string& root_dir, const std::string& name, int64_t version) {
  const fs::path dir = fs::path(root_dir) / name / ("version_" + std::to_string(version));
  fs::create_directories(dir);
  return dir.string();
}

}  // namespace pipetrain
