// Logs training throughput next to the other metrics, as Lightning's ThroughputMonitor:
// optimizer steps, samples, items (tokens, for a language model) and model FLOPs per second, and
// the model FLOPs utilisation (MFU) against a given peak. Figures cover the window between two
// logging steps (every log_every_n_steps optimizer steps); the device is synchronised only at
// those steps, so the figures are of the work done, not of how far ahead the host has queued it.
// The first window starts after the first logging step (warm-up and the first step's one-time
// costs stay out), and a window that a validation run interrupts is not logged.
//
//   trainer_options.callbacks({std::make_shared<pipetrain::ThroughputMonitor>(
//       pipetrain::ThroughputMonitorOptions().items_per_sample(1024).flops_per_sample(f))});
#pragma once

#include <torch/arg.h>

#include <cstdint>

#include "pipetrain/callback.h"

namespace pipetrain {

struct ThroughputMonitorOptions {
  // Items (tokens) in one sample; 0: items per second not logged.
  TORCH_ARG(int64_t, items_per_sample) = 0;
  // Model FLOPs of one sample's forward and backward (e.g. 6 x parameters x tokens for a
  // transformer, plus attention); 0: FLOPs per second and MFU not logged.
  TORCH_ARG(double, flops_per_sample) = 0;
  // Peak FLOP/s of one device at the precision trained (989e12 for an H100/H200 in bf16); with
  // flops_per_sample, MFU = model FLOPs per second / (available_flops x processes).
  TORCH_ARG(double, available_flops) = 0;
};

// Keys: "train/steps_per_sec", "train/samples_per_sec", and where the options allow
// "train/items_per_sec", "train/flops_per_sec", "train/mfu"; all over the whole run (every
// process), logged at the logging step that closes the window.
class ThroughputMonitor : public Callback {
 public:
  // Throws std::invalid_argument for a negative option.
  explicit ThroughputMonitor(ThroughputMonitorOptions options = {});

  void on_fit_start(Trainer& trainer, Module& module) override;
  void on_train_batch_end(Trainer& trainer, Module& module, const TrainBatchOutputs& outputs,
                          const Batch& batch, int64_t batch_idx) override;
  void on_validation_end(Trainer& trainer, Module& module) override;

 private:
  ThroughputMonitorOptions options_;
  bool window_open_ = false;
  double window_start_ = 0;  // seconds, steady clock
  int64_t window_steps_ = 0;
  int64_t window_samples_ = 0;
  int64_t last_step_ = 0;  // trainer.global_step() at the last batch end
};

}  // namespace pipetrain
