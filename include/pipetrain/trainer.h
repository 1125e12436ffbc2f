// The Trainer: Lightning's training loop for a pipetrain Module. Options keep Lightning's names.
//
//   pipetrain::Trainer
//   trainer(pipetrain::TrainerOptions().strategy("pipe").devices(2).max_epochs(3)); MyModule model;
//   // build after the Trainer: it seeds and launches ranks trainer.fit(model, train_loader);
#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "pipetrain/data.h"
#include "pipetrain/pipe.h"

namespace pipetrain {

class CSVLogger;
class Module;
class Strategy;
class World;

struct TrainerOptions {
  // "single" | "pipe" | any registered name.
  TORCH_ARG(std::string, strategy) = "single";
  // Processes to run on; under `pipe`, the number of stages.
  TORCH_ARG(int64_t, devices) = 1;
  // How `pipe` splits the model and schedules micro-batches.
  TORCH_ARG(PipeOptions, pipe) = {};
  TORCH_ARG(int64_t, max_epochs) = 1000;
  // -1: no limit.
  TORCH_ARG(int64_t, max_steps) = -1;
  TORCH_ARG(uint64_t, seed) = 0;
  TORCH_ARG(std::string, default_root_dir) = ".";
  TORCH_ARG(int64_t, log_every_n_steps) = 50;
  // Print a line per logging step (rank 0).
  TORCH_ARG(bool, enable_progress_bar) = true;
  // Longest wait for another rank before giving up with an error.
  TORCH_ARG(int64_t, timeout_seconds) = 300;
};

class Trainer {
 public:
  // Seeds the default generator with `seed`, then joins the run's ranks. When `devices` asks for
  // more processes than were launched (no torchrun or SLURM variables), it re-runs this program
  // once per rank, as torchrun would, and the launching process exits with their status.
  explicit Trainer(TrainerOptions options);
  ~Trainer();

  void fit(Module& module, const DataLoader& train_loader);

  int64_t global_step() const { return global_step_; }
  int64_t current_epoch() const { return current_epoch_; }
  bool is_global_zero() const;
  const World& world() const { return *world_; }
  // version_<N> directory of this run's logs (rank 0; empty elsewhere).
  std::string log_dir() const;
  const TrainerOptions& options() const { return options_; }

 private:
  void log_step(const std::map<std::string, double>& metrics, int64_t batches_per_epoch);

  TrainerOptions options_;
  std::unique_ptr<Strategy> strategy_;
  std::shared_ptr<World> world_;
  std::unique_ptr<CSVLogger> logger_;
  int64_t global_step_ = 0;
  int64_t current_epoch_ = 0;
  double fit_start_seconds_ = 0;
};

}  // namespace pipetrain
