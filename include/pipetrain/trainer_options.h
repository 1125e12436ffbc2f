// Everything a Trainer can be told, under Lightning's names.
#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/pipe.h"

namespace pipetrain {

class Callback;

// How many batches of a loader to use (or, for val_check_interval, how often): Lightning's
// int-or-float arguments. A fraction of 1.0 means all of them.
class BatchLimit {
 public:
  static BatchLimit fraction(double f);
  static BatchLimit count(int64_t n);
  // "0.25" -> fraction, "10" -> count; throws std::invalid_argument naming `text`.
  static BatchLimit parse(const std::string& text);
  BatchLimit() = default;

  // The number of batches out of `available`. Throws std::invalid_argument naming `option` (the
  // limit's name, for the message) for a fraction above 0 that comes to none of them, as
  // Lightning refuses it: the loop would run no batch without a word.
  int64_t of(int64_t available, const std::string& option = "the batch limit") const;
  bool is_fraction() const { return is_fraction_; }
  double value() const { return value_; }
  std::string to_string() const;

 private:
  bool is_fraction_ = true;
  double value_ = 1.0;
};

// Let the planner choose a pipeline's balance, micro-batches (chunks), schedule and recompute
// mode (`pipe` and `ddp_pipe`; under ddp_pipe the ZeRO stage too): rank 0 builds the model's
// layers one at a time, times each one's forward, backward and AdamW step on the first training
// batch and counts what it holds in memory, then weighs every schedule (gpipe, 1f1b, zbh1, zbh2
// with one stage per rank; interleaved1f1b and zbv with two), every power of two of chunks that
// divides the batch, every recompute mode and, with replicas, ZeRO stage 0 and 1, each with the
// balance that makes its slowest stage fastest, and trains the plan predicted fastest whose
// predicted peak memory fits max_memory on every rank. The plan is printed, written to plan.json in
// the run's folder, and compared with what the run measures (its first step's memory, its mean step
// time).
struct PlanOptions {
  // Bytes per device the plan must fit; 0: TrainerOptions::max_memory (0 there too: no limit).
  TORCH_ARG(int64_t, max_memory) = 0;
  // A plan.json written by an earlier run: run that plan again, without profiling.
  TORCH_ARG(std::string, file) = "";
  // Timed runs of each layer (after one to warm up); each time is the fastest.
  TORCH_ARG(int64_t, repeats) = 3;
  // The schedules weighed: interleaved1f1b and zbv with two stages per rank, the others one.
  TORCH_ARG(std::vector<std::string>, schedules) = std::vector<std::string>{
      "gpipe", "1f1b", "zbh1", "zbh2", "interleaved1f1b", "zbv"};
  // Bytes per second, one way, between the devices of a node (NVLink 4's 450 GB/s) and between
  // nodes (a 400 Gb/s InfiniBand NIC's 50 GB/s): a micro-batch's activations crossing a stage
  // boundary take their bytes over it, and the replicas' gradient all-reduce (a ring) its share.
  // 0: transfers are free.
  TORCH_ARG(double, link_bandwidth) = 450e9;
  TORCH_ARG(double, network_bandwidth) = 50e9;
};

struct TrainerOptions {
  // "single" | "pipe" | "ddp" | "ddp_pipe" | any registered name.
  TORCH_ARG(std::string, strategy) = "single";
  // "cpu" | "cuda" | "auto" (cuda when a GPU is visible). On cuda, each process uses the GPU
  // numbered by its LOCAL_RANK.
  TORCH_ARG(std::string, accelerator) = "auto";
  // Processes per node; under `pipe`, the number of stages.
  TORCH_ARG(int64_t, devices) = 1;
  // Machines the run spans; every node runs `devices` processes (Lightning's num_nodes).
  TORCH_ARG(int64_t, num_nodes) = 1;
  // Under `ddp_pipe`: stages per pipeline; devices x num_nodes / stages replicas of it.
  TORCH_ARG(int64_t, stages) = 0;
  // How `pipe` splits the model and schedules micro-batches.
  TORCH_ARG(PipeOptions, pipe) = {};
  // Set: the planner chooses pipe's balance, chunks, schedule and checkpoint (PlanOptions).
  TORCH_ARG(std::optional<PlanOptions>, plan) = std::nullopt;
  // Under `ddp` and `ddp_pipe`: 1 shares the optimizer's state out among the replicas of each
  // stage (ZeRO stage 1: each replica keeps and updates about 1 / replicas of it, then sends its
  // parameters to the others); 0 keeps it whole on every replica.
  TORCH_ARG(int64_t, zero_stage) = 0;
  // Bytes of tensors one process may hold on its device; 0: no limit. Rank 0 prints every rank's
  // parameters, gradients and optimizer state at the start of fit, and what the first step added
  // at its peak (activations, gradients, workspace) after it; both are held against this limit,
  // the second before the first optimizer step, so that a fit that does not fit fails having
  // trained nothing, naming the rank and what would make it fit.
  TORCH_ARG(int64_t, max_memory) = 0;

  TORCH_ARG(int64_t, max_epochs) = 1000;
  TORCH_ARG(int64_t, min_epochs) = 0;
  // -1: no limit.
  TORCH_ARG(int64_t, max_steps) = -1;
  // Seconds of training after which fit stops; 0: no limit.
  TORCH_ARG(double, max_time) = 0;
  TORCH_ARG(BatchLimit, limit_train_batches) = {};
  TORCH_ARG(BatchLimit, limit_val_batches) = {};
  TORCH_ARG(BatchLimit, limit_test_batches) = {};
  TORCH_ARG(BatchLimit, limit_predict_batches) = {};
  // Validate after this fraction of an epoch, or every this many training batches.
  TORCH_ARG(BatchLimit, val_check_interval) = {};
  TORCH_ARG(int64_t, check_val_every_n_epoch) = 1;
  TORCH_ARG(int64_t, num_sanity_val_steps) = 2;
  TORCH_ARG(int64_t, accumulate_grad_batches) = 1;
  // Stop (with an error on every rank, before the optimizer step) when a training loss is NaN or
  // infinite; false trains on, as Lightning does. Across processes the check is part of every
  // step's stop agreement. In one process it is made where the host waits for the device anyway
  // (each logging step, the epoch's end, the last step, before any checkpoint is saved), so that
  // the host never stalls the device for it: training may run on to that step, and stops there
  // with the error naming the first such step, before any checkpoint holds an update from it.
  TORCH_ARG(bool, stop_on_nonfinite_loss) = true;
  // 0: no clipping. "norm" clips by the global norm over all stages; "value" clamps elements.
  TORCH_ARG(double, gradient_clip_val) = 0;
  TORCH_ARG(std::string, gradient_clip_algorithm) = "norm";
  // N > 0: run N batches of train/val/test once, with no loggers or checkpoints (a smoke test).
  TORCH_ARG(int64_t, fast_dev_run) = 0;
  TORCH_ARG(bool, deterministic) = false;
  TORCH_ARG(bool, enable_progress_bar) = true;
  TORCH_ARG(bool, enable_checkpointing) = true;
  TORCH_ARG(int64_t, log_every_n_steps) = 50;
  // "32-true" | "bf16-mixed" (autocast to bfloat16, fp32 weights) | "bf16-true" (bf16 weights).
  TORCH_ARG(std::string, precision) = "32-true";
  // Which loggers rank 0 writes: "csv", "tensorboard"; empty: none.
  TORCH_ARG(std::vector<std::string>, loggers) = std::vector<std::string>{"csv", "tensorboard"};
  TORCH_ARG(std::vector<std::shared_ptr<Callback>>, callbacks) = {};
  TORCH_ARG(uint64_t, seed) = 0;
  TORCH_ARG(std::string, default_root_dir) = ".";
  // Chrome-trace JSON of fit's forward, backward, send, receive and optimizer spans on every rank
  // (trace.h); empty: none.
  TORCH_ARG(std::string, trace) = "";
  // Longest wait for another rank before giving up with an error.
  TORCH_ARG(int64_t, timeout_seconds) = 300;
};

}  // namespace pipetrain
