// Checkpoint files: a `<name>.ckpt` folder holding everything needed to resume training exactly.
//   model.safetensors    every weight of the whole Sequential under its global name ("3.weight"),
//                        so a file saved by any layout loads into any other
//   trainer_state.json   epoch, step and loop position, scheduler steps, layout, callback state
//   rank-<r>.pt          rank r's optimizer state and random generator state (same layout only)
// The folder is written under a temporary name and renamed into place (an atomic exchange when
// it already exists), so a crash mid-save never leaves a broken checkpoint at the final name.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

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
  int64_t world_size = 1;
  std::map<std::string, std::string> layout;
  std::map<std::string, std::map<std::string, std::string>> callbacks;
};

std::string checkpoint_weights_path(const std::string& checkpoint);
std::string checkpoint_rank_path(const std::string& checkpoint, int64_t rank);

// The processes writing one checkpoint together, as write_checkpoint needs them: which one this
// is (0 writes the shared files), a barrier among all of them, and how to tell the others that
// this one failed (their barrier then fails with that error). One process: the defaults.
struct CheckpointWriters {
  int64_t rank = 0;
  std::function<void()> barrier = [] {};
  std::function<void(const std::string& error)> publish_error = [](const std::string&) {};
};

// Collective over `writers`. Into `path`.partial, rank 0 writes `weights` and `state` and every
// rank the bytes `rank_state` returns, as rank-<r>.pt; then rank 0 moves the folder into place. A
// failed write (a full disk) throws naming the file and the reason, removes the partial folder and
// leaves a checkpoint already at `path` as it was.
void write_checkpoint(const CheckpointWriters& writers, const std::string& path,
                      const std::map<std::string, at::Tensor>& weights, const TrainingState& state,
                      const std::function<std::string()>& rank_state);

TrainingState read_training_state(const std::string& checkpoint);
std::map<std::string, at::Tensor> read_checkpoint_weights(const std::string& checkpoint);

// Copies `weights` into `model` after checking that every parameter and buffer is there with its
// shape (a tensor registered under several names, under one of them) and no name is unknown; on any
// mismatch throws before touching the model. `source` names the file in messages.
void load_weights(torch::nn::Sequential& model, const std::map<std::string, at::Tensor>& weights,
                  const std::string& source);

}  // namespace pipetrain
