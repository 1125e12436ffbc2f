// Logs the optimizer's learning rate next to the other metrics, as Lightning's
// LearningRateMonitor, so a schedule can be checked in metrics.csv or TensorBoard rather than
// trusted. Keys are "lr-<Optimizer>" ("lr-Adam"), or "lr-Adam/pg1", "lr-Adam/pg2", ... with
// several param groups.
#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <map>
#include <string>

#include "pipetrain/callback.h"

namespace torch {
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace pipetrain {

struct LearningRateMonitorOptions {
  // "step": at each step the Trainer logs (global_step % log_every_n_steps == 0);
  // "epoch": once at the end of each training epoch.
  TORCH_ARG(std::string, logging_interval) = "step";
};

class LearningRateMonitor : public Callback {
 public:
  // Throws std::invalid_argument for a logging_interval other than "step" or "epoch".
  explicit LearningRateMonitor(LearningRateMonitorOptions options = {});

  // The learning rate of each param group, under the keys this callback logs. Empty for null.
  static std::map<std::string, double> learning_rates(const torch::optim::Optimizer* optimizer);
  // "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "LBFGS"; "Optimizer" for any other.
  static std::string optimizer_name(const torch::optim::Optimizer& optimizer);

  // Throws std::invalid_argument when the Trainer has no logger to write to.
  void on_fit_start(Trainer& trainer, Module& module) override;
  void on_train_batch_start(Trainer& trainer, Module& module, const Batch& batch,
                            int64_t batch_idx) override;
  void on_train_epoch_end(Trainer& trainer, Module& module) override;

 private:
  void log(Trainer& trainer);

  LearningRateMonitorOptions options_;
  int64_t last_logged_step_ = -1;  // with gradient accumulation a step spans several batches
};

}  // namespace pipetrain
