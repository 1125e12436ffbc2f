#include "support/fit_run.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <iterator>
#include <sstream>

#include "pipetrain/checkpoint_io.h"
#include "support/multiprocess.h"
#include "support/trainer_run.h"

namespace pipetrain::testing {

TrainerOptions FitRun::trainer_options(PipeOptions pipe) const {
  return logged_run_options(root).strategy(strategy).devices(devices).max_steps(max_steps).pipe(
      pipe.chunks(chunks).schedule(schedule).checkpoint(checkpoint));
}

TrainerOptions PipeLayoutRun::trainer_options(PipeOptions pipe) const {
  return FitRun::trainer_options(
      pipe.virtual_stages(virtual_stages).fuse_gradient_accumulation(fuse));
}

void PipeLayoutRun::set_layout(const PipeLayout& layout, const std::string& dir, int64_t chunks) {
  root = dir + "/" + std::to_string(layout.stages) + "-" + layout.schedule + "-" +
         layout.checkpoint + (layout.fuse ? "-fused" : "");
  strategy = "pipe";
  devices = layout.stages;
  this->chunks = chunks;
  schedule = layout.schedule;
  checkpoint = layout.checkpoint;
  virtual_stages = layout.virtual_stages;
  fuse = layout.fuse;
}

std::string FitRun::last_checkpoint() const { return root + "/checkpoints/last.ckpt"; }

TensorMap FitRun::final_weights() const { return read_checkpoint_weights(last_checkpoint()); }

std::string FitRun::rank_tensors(int64_t rank) const {
  return root + "/rank-" + std::to_string(rank) + ".safetensors";
}

namespace {
std::string error_path(const std::string& root, int64_t rank) {
  return root + "/error-" + std::to_string(rank) + ".txt";
}
}  // namespace

void FitRun::record_error_of(const std::function<void()>& fit) const {
  try {
    fit();
  } catch (const std::exception& e) {
    std::ofstream(error_path(root, worker_rank())) << e.what();
    throw;
  }
}

std::string FitRun::recorded_error(int64_t rank) const {
  std::ifstream file(error_path(root, rank));
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

int64_t worker_rank() { return std::stoll(env_or("RANK", "0")); }

std::vector<std::string> split_field_names(const std::string& names) {
  std::vector<std::string> split;
  std::istringstream list(names);
  for (std::string name; std::getline(list, name, ',');) {
    name.erase(0, name.find_first_not_of(' '));
    split.push_back(name);
  }
  return split;
}

namespace fit_run_detail {

std::string variable(const std::string& name) {
  std::string upper = name;
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return "FIT_RUN_" + upper;
}

}  // namespace fit_run_detail

}  // namespace pipetrain::testing
