// Checkpoint files: a `<name>.ckpt` folder holding everything needed to resume training exactly.
//   model.safetensors    the weights, when one process holds them all; otherwise each stage's
//                        process writes its own layers' to model-0000k-of-0000N.safetensors and
//                        model.safetensors.index.json says which file holds each tensor (Hugging
//                        Face's sharded layout). Every tensor goes by its global name ("3.weight"),
//                        so a checkpoint saved by any layout loads into any other, each process
//                        reading only the tensors it needs
//   trainer_state.json   epoch, step and loop position, scheduler steps, layout, callback state
//   rank-<r>.pt          rank r's optimizer state and random generators' state: the CPU's and
//                        its CUDA device's (restored under the same layout only)
// The folder is written under a temporary name and renamed into place (an atomic exchange when
// it already exists), so a crash mid-save never leaves a broken checkpoint at the final name.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace pipetrain {

// Where a fit is: what a checkpoint saves and a resumed fit starts from, as it is.
struct FitProgress {
  int64_t epoch = 0;            // the epoch running (or just finished)
  int64_t batch_idx = 0;        // the next training batch of `epoch` to run
  int64_t global_step = 0;      // optimizer steps taken
  bool epoch_finished = false;  // `epoch`'s end-of-epoch work is done
  // The same position as the start of what runs next: the next epoch once this one finished.
  FitProgress next() const {
    return epoch_finished ? FitProgress{epoch + 1, 0, global_step, false} : *this;
  }
};

// Where the training data stands, in terms that do not depend on the layout: how many samples of
// the epoch's order have been trained on, and what decides that order.
struct DataPosition {
  int64_t samples = 0;  // of `progress.epoch`'s order, in whole global batches
  uint64_t seed = 0;
  bool shuffle = false;
  int64_t dataset_size = 0;
};

struct TrainingState {
  FitProgress progress;
  std::optional<DataPosition> data;  // absent in checkpoints written before it was recorded
  int64_t lr_scheduler_steps = -1;   // -1: no scheduler
  // The scheduler's learning rates at lr_scheduler_steps, per param group (empty: not recorded).
  std::vector<double> lr_scheduler_lrs;
  int64_t world_size = 1;
  std::map<std::string, std::string> layout;
  std::map<std::string, std::map<std::string, std::string>> callbacks;
};

std::string checkpoint_rank_path(const std::string& checkpoint, int64_t rank);

// One process's part of a checkpoint's weights: file `index` of the `count` that the processes
// write together (one file: model.safetensors; more: numbered shards and an index). A process
// holding nothing of its own to write (a replica of what the first replica writes) has index -1.
struct WeightShard {
  int64_t index = 0;
  int64_t count = 1;
  std::map<std::string, at::Tensor> weights;
};

// The processes writing one checkpoint together, as write_checkpoint needs them: which one this
// is (0 writes the shared files), a barrier among all of them, and how to tell the others that
// this one failed (their barrier then fails with that error). One process: the defaults.
struct CheckpointWriters {
  int64_t rank = 0;
  std::function<void()> barrier = [] {};
  std::function<void(const std::string& error)> publish_error = [](const std::string&) {};
};

// Collective over `writers`. Into `path`.partial, every rank writes its `weights` shard and the
// bytes `rank_state` returns, as rank-<r>.pt, and rank 0 `state` and the shards' index; then rank 0
// moves the folder into place. A failed write (a full disk) on any rank throws naming the file and
// the reason, removes the partial folder and leaves a checkpoint already at `path` as it was.
void write_checkpoint(const CheckpointWriters& writers, const std::string& path,
                      const WeightShard& weights, const TrainingState& state,
                      const std::function<std::string()>& rank_state);

TrainingState read_training_state(const std::string& checkpoint);

// A checkpoint's weights as stored: every tensor's name and shape, read from the files' headers
// alone, and the tensors themselves read on demand from only the files that hold them.
class StoredWeights {
 public:
  // Throws naming the checkpoint when it has no weights, its index is corrupt or names a file that
  // is missing or does not hold what the index says.
  explicit StoredWeights(const std::string& checkpoint);
  // The file to name in messages: model.safetensors or model.safetensors.index.json.
  const std::string& source() const { return source_; }
  const std::map<std::string, std::vector<int64_t>>& shapes() const { return shapes_; }
  bool contains(const std::string& name) const { return shapes_.count(name) > 0; }
  // The named tensors, on the CPU; each file holding some of them is opened once.
  std::map<std::string, at::Tensor> read(const std::set<std::string>& names) const;
  std::map<std::string, at::Tensor> read_all() const;

 private:
  std::string source_;
  std::map<std::string, std::string> file_of_;  // tensor name -> path of the file holding it
  std::map<std::string, std::vector<int64_t>> shapes_;
};

// Every tensor of a checkpoint's weights, whichever files hold them.
std::map<std::string, at::Tensor> read_checkpoint_weights(const std::string& checkpoint);

// Copies `weights` into `model` after checking that every parameter and buffer is there with its
// shape (a tensor registered under several names, under one of them) and no name is unknown; on any
// mismatch throws before touching the model. `source` names the file in messages.
void load_weights(torch::nn::Sequential& model, const std::map<std::string, at::Tensor>& weights,
                  const std::string& source);

// Which of a checkpoint's weights one process loads, and under which names.
struct WeightSelection {
  // The model's names to read and copy (all, when unset): a stage's process reads its own layers'.
  std::function<bool(const std::string& name)> wanted;
  // Stored names of layers another process holds (a model built per rank): this process cannot
  // tell whether the model has them; their holders check them.
  std::function<bool(const std::string& name)> held_elsewhere;
  // Where a tensor stored once under another name is (a tied parameter: {"5.weight": "0.weight"}).
  std::map<std::string, std::string> stored_under;
};

// The same from a checkpoint's stored weights, checked against the listing before any tensor is
// read; only the tensors `selection` wants are read.
void load_weights(torch::nn::Sequential& model, const StoredWeights& stored,
                  const WeightSelection& selection = {});

}  // namespace pipetrain
