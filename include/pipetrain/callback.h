// Hooks into the Trainer's loops, as Lightning's Callback. Every rank runs every callback with
// the same trainer state and the same (already reduced) metrics, so decisions such as "save a
// checkpoint now" or "stop" are taken identically everywhere without further communication.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "pipetrain/data.h"

namespace pipetrain {

class Module;
class Trainer;

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
  virtual void on_train_batch_start(Trainer&, Module&, const Batch&, int64_t /*batch_idx*/) {}
  // After the batch's backward and, when one was due, the optimizer step.
  virtual void on_train_batch_end(Trainer&, Module&, const Batch&, int64_t /*batch_idx*/) {}
  virtual void on_before_optimizer_step(Trainer&, Module&) {}
  virtual void on_validation_epoch_start(Trainer&, Module&) {}
  virtual void on_validation_epoch_end(Trainer&, Module&) {}
  // After a validation run's metrics are in trainer.callback_metrics().
  virtual void on_validation_end(Trainer&, Module&) {}
  virtual void on_test_epoch_start(Trainer&, Module&) {}
  virtual void on_test_epoch_end(Trainer&, Module&) {}
};

}  // namespace pipetrain
