#include "pipetrain/checkpoint_io.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "io/file_writer.h"
#include "pipetrain/error.h"
#include "pipetrain/safetensors.h"

namespace pipetrain {
namespace fs = std::filesystem;
namespace {

std::string state_path(const std::string& checkpoint) { return checkpoint + "/trainer_state.json"; }

// Puts `staged` at `target`: an atomic exchange when `target` exists (the old folder then sits at
// `staged` and is removed), a plain rename otherwise.
void move_into_place(const fs::path& staged, const fs::path& target) {
  if (fs::exists(target)) {
    if (syscall(SYS_renameat2, AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(),
                RENAME_EXCHANGE) != 0) {
      // Filesystems without RENAME_EXCHANGE: move the old one aside first.
      const fs::path aside = target.string() + ".old";
      fs::remove_all(aside);
      fs::rename(target, aside);
      fs::rename(staged, target);
      fs::remove_all(aside);
      return;
    }
    fs::remove_all(staged);
    return;
  }
  fs::rename(staged, target);
}

}  // namespace

std::string checkpoint_weights_path(const std::string& checkpoint) {
  return checkpoint + "/model.safetensors";
}

std::string checkpoint_rank_path(const std::string& checkpoint, int64_t rank) {
  return checkpoint + "/rank-" + std::to_string(rank) + ".pt";
}

void write_checkpoint(const CheckpointWriters& writers, const std::string& path,
                      const std::map<std::string, at::Tensor>& weights, const TrainingState& state,
                      const std::function<std::string()>& rank_state) {
  const fs::path target = fs::absolute(path);
  const std::string staged = target.string() + ".partial";
  const bool writes_shared_files = writers.rank == 0;
  if (writes_shared_files) {
    fs::remove_all(staged);
    fs::create_directories(staged);
  }
  writers.barrier();
  try {
    write_file(checkpoint_rank_path(staged, writers.rank), rank_state());
    if (writes_shared_files) {
      save_safetensors(checkpoint_weights_path(staged), weights, {{"format", "pt"}});
      nlohmann::json json{{"format_version", 1},
                          {"epoch", state.progress.epoch},
                          {"global_step", state.progress.global_step},
                          {"batch_idx", state.progress.batch_idx},
                          {"epoch_finished", state.progress.epoch_finished},
                          {"lr_scheduler_steps", state.lr_scheduler_steps},
                          {"world_size", state.world_size},
                          {"layout", state.layout},
                          {"callbacks", state.callbacks}};
      if (state.data) {
        json["data"] = {{"samples", state.data->samples},
                        {"seed", state.data->seed},
                        {"shuffle", state.data->shuffle},
                        {"dataset_size", state.data->dataset_size}};
      }
      write_file(state_path(staged), json.dump(2) + "\n");
    }
  } catch (const std::exception& e) {
    // The other ranks learn of it through the published error when their barrier fails.
    std::error_code ignored;
    fs::remove_all(staged, ignored);
    writers.publish_error(error_message(e));
    throw;
  }
  writers.barrier();
  if (writes_shared_files) move_into_place(staged, target);
  writers.barrier();
}

TrainingState read_training_state(const std::string& checkpoint) {
  if (!fs::is_directory(checkpoint)) {
    throw std::runtime_error("checkpoint " + checkpoint +
                             " does not exist (a checkpoint is a .ckpt folder written by "
                             "pipetrain); check --ckpt-path");
  }
  std::ifstream in(state_path(checkpoint));
  if (!in) {
    throw std::runtime_error("checkpoint " + checkpoint +
                             " has no trainer_state.json: it is incomplete or not a pipetrain "
                             "checkpoint");
  }
  try {
    const auto json = nlohmann::json::parse(in);
    TrainingState state;
    state.progress.epoch = json.at("epoch").get<int64_t>();
    state.progress.global_step = json.at("global_step").get<int64_t>();
    state.progress.batch_idx = json.at("batch_idx").get<int64_t>();
    state.progress.epoch_finished = json.at("epoch_finished").get<bool>();
    state.lr_scheduler_steps = json.at("lr_scheduler_steps").get<int64_t>();
    state.world_size = json.at("world_size").get<int64_t>();
    state.layout = json.at("layout").get<std::map<std::string, std::string>>();
    state.callbacks =
        json.at("callbacks").get<std::map<std::string, std::map<std::string, std::string>>>();
    if (json.contains("data")) {
      const auto& data = json.at("data");
      state.data =
          DataPosition{data.at("samples").get<int64_t>(), data.at("seed").get<uint64_t>(),
                       data.at("shuffle").get<bool>(), data.at("dataset_size").get<int64_t>()};
    }
    return state;
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("checkpoint " + checkpoint + " has a corrupt trainer_state.json (" +
                             e.what() + ")");
  }
}

std::map<std::string, at::Tensor> read_checkpoint_weights(const std::string& checkpoint) {
  if (!fs::is_directory(checkpoint)) {
    throw std::runtime_error("checkpoint " + checkpoint +
                             " does not exist (a checkpoint is a .ckpt folder written by "
                             "pipetrain); check --ckpt-path");
  }
  return load_safetensors(checkpoint_weights_path(checkpoint));
}

void load_weights(torch::nn::Sequential& model, const std::map<std::string, at::Tensor>& weights,
                  const std::string& source) {
  auto targets = model->named_parameters();
  for (const auto& b : model->named_buffers()) targets.insert(b.key(), b.value());
  // A tensor registered under several names (a tied weight) is stored under one of them.
  std::map<const c10::TensorImpl*, std::string> stored_as;
  for (const auto& item : targets) {
    if (weights.count(item.key())) stored_as[item.value().unsafeGetTensorImpl()] = item.key();
  }
  for (const auto& item : targets) {
    const auto it = weights.find(item.key());
    if (it == weights.end()) {
      if (stored_as.count(item.value().unsafeGetTensorImpl())) continue;
      throw std::runtime_error(source + " has no tensor '" + item.key() +
                               "': it was saved from a different model");
    }
    if (!it->second.sizes().equals(item.value().sizes())) {
      throw std::runtime_error(source + " holds '" + item.key() + "' with shape " +
                               shape_text(it->second.sizes()) + " but the model's is " +
                               shape_text(item.value().sizes()) +
                               ": it was saved from a different model");
    }
  }
  for (const auto& [name, tensor] : weights) {
    if (!targets.contains(name)) {
      throw std::runtime_error(source + " has a tensor '" + name +
                               "' the model does not have: it was saved from a different model");
    }
  }
  torch::NoGradGuard no_grad;
  for (const auto& item : targets) {
    const auto it = weights.find(item.key());
    if (it != weights.end()) item.value().copy_(it->second);
  }
}

}  // namespace pipetrain
