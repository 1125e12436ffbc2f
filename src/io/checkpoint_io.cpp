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
#include "pipetrain/hf_folder.h"
#include "pipetrain/safetensors.h"

namespace pipetrain {
namespace fs = std::filesystem;
namespace {

using Json = nlohmann::json;

constexpr const char* kSingleWeightsFile = "model.safetensors";
constexpr const char* kWeightsIndexFile = "model.safetensors.index.json";

std::string state_path(const std::string& checkpoint) { return checkpoint + "/trainer_state.json"; }

// Hugging Face's names for the files of a sharded model: model-00001-of-00004.safetensors.
std::string weights_file_name(int64_t index, int64_t count) {
  if (count == 1) return kSingleWeightsFile;
  return shard_name(static_cast<size_t>(index), static_cast<size_t>(count));
}

// The index of `count` shards written into `folder`, from their headers (which tensors, how many
// bytes): Hugging Face's model.safetensors.index.json.
void write_weights_index(const fs::path& folder, int64_t count) {
  Json weight_map = Json::object();
  int64_t total_size = 0;
  for (int64_t index = 0; index < count; ++index) {
    const std::string name = weights_file_name(index, count);
    for (const auto& [tensor, entry] : read_safetensors_header((folder / name).string())) {
      weight_map[tensor] = name;
      total_size += entry.nbytes;
    }
  }
  const Json index{{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  write_file((folder / kWeightsIndexFile).string(), index.dump(2) + "\n");
}

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

std::string checkpoint_rank_path(const std::string& checkpoint, int64_t rank) {
  return checkpoint + "/rank-" + std::to_string(rank) + ".pt";
}

void write_checkpoint(const CheckpointWriters& writers, const std::string& path,
                      const WeightShard& weights, const TrainingState& state,
                      const std::function<std::string()>& rank_state) {
  const fs::path target = fs::absolute(path);
  const std::string staged = target.string() + ".partial";
  const bool writes_shared_files = writers.rank == 0;
  if (writes_shared_files) {
    fs::remove_all(staged);
    fs::create_directories(staged);
  }
  writers.barrier();
  // A failed write removes the staged folder; the other ranks learn of it through the published
  // error when their barrier fails.
  const auto abandon = [&](const std::exception& e) {
    std::error_code ignored;
    fs::remove_all(staged, ignored);
    writers.publish_error(error_message(e));
    throw;
  };
  try {
    write_file(checkpoint_rank_path(staged, writers.rank), rank_state());
    if (weights.index >= 0) {
      save_safetensors(staged + "/" + weights_file_name(weights.index, weights.count),
                       weights.weights, {{"format", "pt"}});
    }
    if (writes_shared_files) {
      nlohmann::json json{{"format_version", 1},
                          {"epoch", state.progress.epoch},
                          {"global_step", state.progress.global_step},
                          {"batch_idx", state.progress.batch_idx},
                          {"epoch_finished", state.progress.epoch_finished},
                          {"lr_scheduler_steps", state.lr_scheduler_steps},
                          {"lr_scheduler_lrs", state.lr_scheduler_lrs},
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
    abandon(e);
  }
  writers.barrier();
  if (writes_shared_files) {
    try {
      // Every shard is written now: the index lists what they hold.
      if (weights.count > 1) write_weights_index(staged, weights.count);
      move_into_place(staged, target);
    } catch (const std::exception& e) {
      abandon(e);
    }
  }
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
    if (json.contains("lr_scheduler_lrs")) {
      state.lr_scheduler_lrs = json.at("lr_scheduler_lrs").get<std::vector<double>>();
    }
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

StoredWeights::StoredWeights(const std::string& checkpoint) {
  if (!fs::is_directory(checkpoint)) {
    throw std::runtime_error("checkpoint " + checkpoint +
                             " does not exist (a checkpoint is a .ckpt folder written by "
                             "pipetrain); check --ckpt-path");
  }
  const fs::path folder(checkpoint);
  std::set<std::string> files;
  if (fs::is_regular_file(folder / kSingleWeightsFile)) {
    source_ = (folder / kSingleWeightsFile).string();
    files.insert(source_);
    for (const auto& [name, entry] : read_safetensors_header(source_)) file_of_[name] = source_;
  } else if (fs::is_regular_file(folder / kWeightsIndexFile)) {
    source_ = (folder / kWeightsIndexFile).string();
    std::ifstream in(source_);
    Json weight_map;
    try {
      weight_map = Json::parse(in).at("weight_map");
      if (!weight_map.is_object()) throw std::runtime_error("weight_map is not an object");
      for (const auto& [name, file] : weight_map.items()) {
        const std::string shard = file.get<std::string>();
        // A shard is a file beside the index: no path may lead out of the folder.
        if (shard.empty() || shard.find('/') != std::string::npos || shard == "..") {
          throw std::runtime_error("tensor \"" + name + "\" is in \"" + shard +
                                   "\", not a file beside the index");
        }
        file_of_[name] = (folder / shard).string();
        files.insert(file_of_[name]);
      }
    } catch (const std::exception& e) {
      throw std::runtime_error("checkpoint " + checkpoint + " has a corrupt " + kWeightsIndexFile +
                               " (" + error_message(e) + "): it was not fully written");
    }
  } else {
    throw std::runtime_error("checkpoint " + checkpoint + " holds neither " + kSingleWeightsFile +
                             " nor " + kWeightsIndexFile +
                             ": it is incomplete or not a pipetrain checkpoint");
  }
  // Each file's header: the shapes, and that every file holds what the index says it does.
  std::map<std::string, std::set<std::string>> listed;
  for (const auto& file : files) {
    if (!fs::is_regular_file(file)) {
      throw std::runtime_error("checkpoint " + checkpoint + ": " + source_ + " puts weights in " +
                               fs::path(file).filename().string() +
                               ", which is missing: the checkpoint is incomplete");
    }
    for (const auto& [name, entry] : read_safetensors_header(file)) {
      listed[file].insert(name);
      const auto it = file_of_.find(name);
      if (it != file_of_.end() && it->second == file) shapes_[name] = entry.shape;
    }
  }
  for (const auto& [name, file] : file_of_) {
    if (listed[file].count(name) == 0) {
      throw std::runtime_error("checkpoint " + checkpoint + ": " + source_ + " puts tensor \"" +
                               name + "\" in " + fs::path(file).filename().string() +
                               ", which does not hold it: the index is not the one written with "
                               "the shards");
    }
  }
}

std::map<std::string, at::Tensor> StoredWeights::read(const std::set<std::string>& names) const {
  std::map<std::string, std::set<std::string>> by_file;
  for (const auto& name : names) {
    const auto it = file_of_.find(name);
    if (it == file_of_.end()) {
      throw std::invalid_argument(source_ + " has no tensor '" + name + "'");
    }
    by_file[it->second].insert(name);
  }
  std::map<std::string, at::Tensor> tensors;
  for (const auto& [file, wanted] : by_file) tensors.merge(load_safetensors(file, wanted));
  return tensors;
}

std::map<std::string, at::Tensor> StoredWeights::read_all() const {
  std::set<std::string> names;
  for (const auto& [name, file] : file_of_) names.insert(name);
  return read(names);
}

std::map<std::string, at::Tensor> read_checkpoint_weights(const std::string& checkpoint) {
  return StoredWeights(checkpoint).read_all();
}

namespace {

// Where each parameter and buffer of `model` loads from, and the names a tied tensor is stored
// under twice (a name and the one it loads from), whose values must then agree.
struct StoredMatch {
  std::map<std::string, std::string> from;
  std::vector<std::pair<std::string, std::string>> stored_twice;
};

// For each parameter and buffer of `model`, the stored name it loads from, after checking that
// each is stored with its shape and nothing stored is unknown to the model. A tensor registered
// under several names (a tied weight), or tied by name to another (`stored_under`), loads from its
// first stored name, so that every copy of it takes the same values.
StoredMatch match_stored(torch::nn::Sequential& model,
                         const std::map<std::string, std::vector<int64_t>>& shapes,
                         const WeightSelection& selection, const std::string& source) {
  const auto& stored_under = selection.stored_under;
  auto targets = model->named_parameters();
  for (const auto& b : model->named_buffers()) targets.insert(b.key(), b.value());
  // A tensor registered under several names (a tied weight) is stored under one of them.
  std::map<const c10::TensorImpl*, std::string> stored_as;
  for (const auto& item : targets) {
    if (shapes.count(item.key())) stored_as.emplace(item.value().unsafeGetTensorImpl(), item.key());
  }
  StoredMatch match;
  for (const auto& item : targets) {
    std::string name = item.key();
    const auto alias = stored_under.find(name);
    const auto same = stored_as.find(item.value().unsafeGetTensorImpl());
    if (alias != stored_under.end() && shapes.count(alias->second)) {
      name = alias->second;
    } else if (same != stored_as.end()) {
      name = same->second;
    } else if (shapes.count(name) == 0) {
      throw std::runtime_error(source + " has no tensor '" + item.key() +
                               "': it was saved from a different model");
    }
    const auto& shape = shapes.at(name);
    if (!item.value().sizes().equals(shape)) {
      throw std::runtime_error(source + " holds '" + name + "' with shape " + shape_text(shape) +
                               " but the model's is " + shape_text(item.value().sizes()) +
                               ": it was saved from a different model");
    }
    if (name != item.key() && shapes.count(item.key())) {
      match.stored_twice.emplace_back(item.key(), name);
    }
    match.from[item.key()] = name;
  }
  for (const auto& [name, shape] : shapes) {
    if (!targets.contains(name) && !(selection.held_elsewhere && selection.held_elsewhere(name))) {
      throw std::runtime_error(source + " has a tensor '" + name +
                               "' the model does not have: it was saved from a different model");
    }
  }
  return match;
}

// A tied tensor stored under two of its names must be stored twice with the same values: two
// different tensors are an untied model's, which this one cannot hold.
void check_stored_twice(const std::vector<std::pair<std::string, std::string>>& stored_twice,
                        const std::map<std::string, at::Tensor>& weights,
                        const std::string& source) {
  for (const auto& [name, first] : stored_twice) {
    if (!torch::equal(weights.at(name), weights.at(first))) {
      throw std::runtime_error(source + " holds '" + first + "' and '" + name +
                               "' as different tensors, but the model ties them (one tensor): "
                               "it was saved from a model without that tie (an untied head?)");
    }
  }
}

void copy_into(torch::nn::Sequential& model, const std::map<std::string, std::string>& from,
               const std::map<std::string, at::Tensor>& weights) {
  auto targets = model->named_parameters();
  for (const auto& b : model->named_buffers()) targets.insert(b.key(), b.value());
  torch::NoGradGuard no_grad;
  for (const auto& item : targets) {
    const auto source = from.find(item.key());
    if (source == from.end()) continue;
    const auto it = weights.find(source->second);
    if (it != weights.end()) item.value().copy_(it->second);
  }
}

}  // namespace

void load_weights(torch::nn::Sequential& model, const std::map<std::string, at::Tensor>& weights,
                  const std::string& source) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, tensor] : weights) shapes[name] = tensor.sizes().vec();
  const auto match = match_stored(model, shapes, WeightSelection(), source);
  check_stored_twice(match.stored_twice, weights, source);
  copy_into(model, match.from, weights);
}

void load_weights(torch::nn::Sequential& model, const StoredWeights& stored,
                  const WeightSelection& selection) {
  auto match = match_stored(model, stored.shapes(), selection, stored.source());
  auto& from = match.from;
  std::set<std::string> names;
  for (auto it = from.begin(); it != from.end();) {
    if (selection.wanted && !selection.wanted(it->first)) {
      it = from.erase(it);
      continue;
    }
    names.insert(it->second);
    ++it;
  }
  std::vector<std::pair<std::string, std::string>> stored_twice;
  for (const auto& pair : match.stored_twice) {
    if (from.count(pair.first) == 0) continue;
    stored_twice.push_back(pair);
    names.insert(pair.first);
  }
  const auto weights = stored.read(names);
  check_stored_twice(stored_twice, weights, stored.source());
  copy_into(model, from, weights);
}

}  // namespace pipetrain
