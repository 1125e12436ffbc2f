// fit as Lightning runs it: loop objects (its fit_loop and training_epoch_loop) that each run as
// `reset(); while (!done()) advance();` and then their end. They act on the Trainer's state, as
// Lightning's loops act on `self.trainer`. Where fit stands is the Trainer's one FitProgress
// (epoch, batch index, global step, whether the epoch finished): a checkpoint saves it and
// restores it as it is, and a resumed loop starts from it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/module.h"
#include "train/memory_report.h"

namespace pipetrain {

class BatchStream;
class Callback;
class DataLoader;
class StopSignals;
class Trainer;

// Calls `hook` on each callback in order (the Trainer keeps checkpoint callbacks last).
template <typename... Params, typename... Args>
void call_hooks(const std::vector<std::shared_ptr<Callback>>& callbacks,
                void (Callback::*hook)(Params...), Args&&... args) {
  for (const auto& callback : callbacks) ((*callback).*hook)(args...);
}

// Seconds on a steady clock (for max_time).
double now_seconds();
// Reduced metrics' values by name, as loggers take them.
std::map<std::string, double> values_of(const ReducedMetrics& metrics);

// What a fit trains and validates on, counted in batches.
struct FitData {
  const DataLoader& train;
  const DataLoader* val;
  int64_t train_batches;      // per epoch, after limit_train_batches
  int64_t val_batches;        // per validation, after limit_val_batches
  int64_t val_check_batches;  // validate every this many training batches
  FitMemory* memory;          // what this rank holds; the fit's first step measures its peak
};

// One epoch, from the batch fit stands at (mid-epoch after a resume) to its last batch, or to the
// optimizer step after which fit stops. The epoch's end (epoch metrics, hooks, an epoch-wise LR
// step) runs only when its last batch did; a stopped epoch ends when the run resumes.
class TrainingEpochLoop {
 public:
  TrainingEpochLoop(Trainer& trainer, Module& module, const FitData& data);
  ~TrainingEpochLoop();
  void run();

 private:
  void reset();
  bool done() const;
  void advance();  // one batch: its step, maybe an optimizer step, maybe a validation
  void on_run_end();
  // After the fit's first step (its peak in `step_peak`), before any optimizer step: every rank's
  // figures printed and held against max_memory.
  void check_first_step_memory(int64_t step_peak);

  Trainer& trainer_;
  Module& module_;
  const FitData& data_;
  std::unique_ptr<BatchStream> batches_;
  LoggedMetrics epoch_metrics_;   // everything logged this epoch, for on_epoch values
  LoggedMetrics window_metrics_;  // since the last optimizer step
  bool stopping_ = false;         // fit stops after the optimizer step just taken
};

// The whole fit: its start (optimizer, resume, hyperparameters, sanity check), epochs until
// max_epochs, max_steps or a stop, and its end (a last checkpoint after a signal, logs, trace).
class FitLoop {
 public:
  FitLoop(Trainer& trainer, Module& module, const DataLoader& train, const DataLoader* val);
  ~FitLoop();
  void run(const std::string& ckpt_path);

 private:
  void reset(const std::string& ckpt_path);
  bool done() const;
  void advance();  // one epoch
  void on_run_end();
  // Every rank's measured peak, logged (peak_memory_mib/rank_<r>) and kept in callback_metrics
  // on every rank, and printed by rank 0.
  void log_peak_memory();

  Trainer& trainer_;
  Module& module_;
  FitMemory memory_;
  FitData data_;
  std::unique_ptr<StopSignals> signals_;  // SIGTERM, SIGUSR1: stop after the step in progress
};

}  // namespace pipetrain
