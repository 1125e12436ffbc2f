#include "pipetrain/checkpoint_path.h"

#include <filesystem>
#include <map>
#include <stdexcept>
#include <vector>

#include "pipetrain/checkpoint_io.h"

namespace pipetrain {
namespace fs = std::filesystem;
namespace {

// The best checkpoint the checkpoint callback recorded in `last` (its state_key() begins
// "ModelCheckpoint{", model_checkpoint.cpp).
std::string best_checkpoint_recorded_in(const std::string& last) {
  std::vector<std::map<std::string, std::string>> records;
  for (const auto& [key, state] : read_training_state(last).callbacks) {
    if (key.rfind("ModelCheckpoint{", 0) == 0) records.push_back(state);
  }
  if (records.size() != 1) {
    throw std::runtime_error("--ckpt-path best: " + last + " holds the state of " +
                             std::to_string(records.size()) +
                             " checkpoint callbacks, not one: pass the checkpoint's path");
  }
  auto& record = records.front();
  const std::string best = record["best_model_path"];
  if (best.empty()) {
    throw std::runtime_error(
        "--ckpt-path best: the checkpoint callback recorded in " + last +
        " has saved no best checkpoint (it saves one at an epoch's end, or every "
        "--every-n-train-steps; --save-top-k 0 keeps none): pass a path, or --ckpt-path last");
  }
  if (fs::exists(best)) return best;
  // The run's folder was moved or copied: the callback kept its files beside last.ckpt.
  const fs::path moved = fs::path(last).parent_path() / fs::path(best).filename();
  if (fs::path(best).parent_path() == fs::path(record["dirpath"]) && fs::exists(moved)) {
    return moved.string();
  }
  throw std::runtime_error("--ckpt-path best: " + last + " records " + best +
                           " as the best checkpoint, and it is not there: pass a path");
}

}  // namespace

std::string find_last_checkpoint(const std::string& default_root_dir) {
  std::string newest;
  fs::file_time_type newest_time;
  const fs::path logs = fs::path(default_root_dir) / "lightning_logs";
  if (fs::exists(logs)) {
    for (const auto& entry : fs::recursive_directory_iterator(logs)) {
      if (entry.is_directory() && entry.path().filename() == "last.ckpt") {
        const auto time = fs::last_write_time(entry.path());
        if (newest.empty() || time > newest_time) {
          newest = entry.path().string();
          newest_time = time;
        }
      }
    }
  }
  return newest;
}

std::string resolve_checkpoint_path(const std::string& ckpt_path,
                                    const std::string& default_root_dir) {
  if (ckpt_path != "last" && ckpt_path != "best") return ckpt_path;
  const std::string last = find_last_checkpoint(default_root_dir);
  if (last.empty() && ckpt_path == "last") {
    throw std::runtime_error("--ckpt-path last: no last.ckpt under " + default_root_dir +
                             "/lightning_logs (save one with ModelCheckpoint's save_last, or pass "
                             "a path)");
  }
  if (last.empty()) {
    throw std::runtime_error(
        "--ckpt-path best: the best checkpoint is recorded in last.ckpt, and there is none under " +
        default_root_dir + "/lightning_logs (fit with --save-last true, or pass a path)");
  }
  return ckpt_path == "last" ? last : best_checkpoint_recorded_in(last);
}

}  // namespace pipetrain
