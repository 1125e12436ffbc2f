// Hooks into the Trainer's loops, as Lightning's Callback. Every rank runs every callback with
// the same trainer state and the same (already reduced) metrics, so decisions such as "save a
// checkpoint now" or "stop" are taken identically everywhere without further communication.
//
// Training batches and optimizer steps are not the same thing under gradient accumulation
// (accumulate_grad_batches > 1): on_train_batch_start and on_train_batch_end run for every batch,
// those that only add to the gradients included, while on_before_optimizer_step runs once per
// optimizer step. In on_train_batch_end, trainer.global_step() has advanced when the batch ended
// an accumulation window with an optimizer step, and not otherwise.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

#include "pipetrain/data.h"

namespace pipetrain {

class Module;
class Trainer;

// What a training batch gave, as Lightning's `outputs` of on_train_batch_end.
struct TrainBatchOutputs {
  // The batch's loss as training_step computed it, on every batch (not scaled for gradient
  // accumulation): the mean of its micro-batches' losses weighted by their rows, or, for a
  // sum_over() loss, their sums over their counts (their sum where the counts add up to 0).
  // Detached, on the device, where the steps ran (each replica's last stage; this replica's rows
  // only) and undefined on other ranks: reading it waits for the step. Decisions every rank must
  // take alike read trainer.callback_metrics().
  at::Tensor loss;
};

class Callback {
 public:
  virtual ~Callback() = default;

  // Key of this callback's state in a checkpoint file; empty: nothing to save.
  virtual std::string state_key() const { return {}; }
  virtual std::map<std::string, std::string> state_dict() const { return {}; }
  virtual void load_state_dict(const std::map<std::string, std::string>& /*state*/) {}

  virtual void on_fit_start(Trainer&, Module&) {}
  virtual void on_fit_end(Trainer&, Module&) {}
  virtual void on_train_epoch_start(Trainer&, Module&) {}
  virtual void on_train_epoch_end(Trainer&, Module&) {}
  // Every training batch, before its forward.
  virtual void on_train_batch_start(Trainer&, Module&, const Batch&, int64_t /*batch_idx*/) {}
  // Every training batch, after its backward and, when the batch closed an accumulation window,
  // the optimizer step; trainer.callback_metrics() then holds what training_step logged, as means
  // over the accumulation window so far.
  virtual void on_train_batch_end(Trainer&, Module&, const TrainBatchOutputs& /*outputs*/,
                                  const Batch&, int64_t /*batch_idx*/) {}
  // The hook as it was before it took `outputs`. Final, so that a callback still overriding it
  // fails to compile rather than never being called: add `const TrainBatchOutputs&` after
  // `Module&`.
  virtual void on_train_batch_end(Trainer&, Module&, const Batch&, int64_t) final {}
  // Once per optimizer step, before gradients are clipped.
  virtual void on_before_optimizer_step(Trainer&, Module&) {}
  virtual void on_validation_epoch_start(Trainer&, Module&) {}
  virtual void on_validation_epoch_end(Trainer&, Module&) {}
  // After a validation run's metrics are in trainer.callback_metrics().
  virtual void on_validation_end(Trainer&, Module&) {}
  virtual void on_test_epoch_start(Trainer&, Module&) {}
  virtual void on_test_epoch_end(Trainer&, Module&) {}
};

}  // namespace pipetrain
