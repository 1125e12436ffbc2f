// Stops fit when a monitored metric stops improving, as Lightning's EarlyStopping. The metric
// comes from trainer.callback_metrics(), which holds the same reduced values on every rank, so
// every rank reaches the same decision and no vote between ranks is needed.
#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "pipetrain/callback.h"

namespace pipetrain {

struct EarlyStoppingOptions {
  TORCH_ARG(std::string, monitor) = "val_loss";
  // An improvement must beat the best score by more than this.
  TORCH_ARG(double, min_delta) = 0.0;
  // Checks without improvement before stopping.
  TORCH_ARG(int64_t, patience) = 3;
  // "min" | "max": which way is better.
  TORCH_ARG(std::string, mode) = "min";
  // Stop at once when the metric is NaN or infinite.
  TORCH_ARG(bool, check_finite) = true;
  // Check at the end of each training epoch rather than after each validation run. Unset, as
  // Lightning's: at the training epoch's end where validation runs (if at all) once at the end of
  // every epoch (val_check_interval 1.0, check_val_every_n_epoch 1), after it otherwise; so a
  // training metric is checked in a fit without validation.
  TORCH_ARG(std::optional<bool>, check_on_train_epoch_end) = std::nullopt;
};

class EarlyStopping : public Callback {
 public:
  // Throws std::invalid_argument for an empty monitor, a bad mode, negative patience or a negative
  // or non-finite min_delta.
  explicit EarlyStopping(EarlyStoppingOptions options = {});

  // The epoch in which this callback asked the Trainer to stop; 0 if it has not.
  int64_t stopped_epoch() const { return stopped_epoch_; }
  // Checks since the last improvement.
  int64_t wait_count() const { return wait_count_; }
  // Best value seen; +inf ("min") or -inf ("max") before the first check.
  double best_score() const { return best_score_; }
  const EarlyStoppingOptions& options() const { return options_; }

  // "EarlyStopping{monitor=val_loss,mode=min}".
  std::string state_key() const override;
  // wait_count, stopped_epoch, best_score, patience: a resumed run keeps counting where it left.
  std::map<std::string, std::string> state_dict() const override;
  void load_state_dict(const std::map<std::string, std::string>& state) override;

  void on_fit_start(Trainer& trainer, Module& module) override;
  void on_fit_end(Trainer& trainer, Module& module) override;
  void on_train_epoch_end(Trainer& trainer, Module& module) override;
  void on_validation_end(Trainer& trainer, Module& module) override;

 private:
  void check(Trainer& trainer);

  EarlyStoppingOptions options_;
  int64_t wait_count_ = 0;
  int64_t stopped_epoch_ = 0;
  double best_score_;
  bool fitting_ = false;
  bool check_on_train_epoch_end_ = false;  // the option, resolved for the running fit
  bool reported_ = false;                  // the reason to stop is printed once per fit
};

}  // namespace pipetrain
