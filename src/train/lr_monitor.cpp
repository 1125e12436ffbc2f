// Reads each param group's learning rate through pipetrain::get_learning_rate (the options classes
// of torch's optimizers share no accessor) and hands it to the Trainer's loggers.
#include "pipetrain/lr_monitor.h"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <stdexcept>

#include "pipetrain/lr_scheduler.h"
#include "pipetrain/trainer.h"

namespace pipetrain {

LearningRateMonitor::LearningRateMonitor(LearningRateMonitorOptions options)
    : options_(std::move(options)) {
  if (options_.logging_interval() != "step" && options_.logging_interval() != "epoch") {
    throw std::invalid_argument(
        "LearningRateMonitor logging_interval must be \"step\" or "
        "\"epoch\" (got \"" +
        options_.logging_interval() + "\")");
  }
}

std::string LearningRateMonitor::optimizer_name(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return "SGD";
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return "Adam";
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return "AdamW";
  if (dynamic_cast<const torch::optim::RMSprop*>(&optimizer)) return "RMSprop";
  if (dynamic_cast<const torch::optim::Adagrad*>(&optimizer)) return "Adagrad";
  if (dynamic_cast<const torch::optim::LBFGS*>(&optimizer)) return "LBFGS";
  return "Optimizer";
}

std::map<std::string, double> LearningRateMonitor::learning_rates(
    const torch::optim::Optimizer* optimizer) {
  std::map<std::string, double> rates;
  if (optimizer == nullptr) return rates;
  const std::string key = "lr-" + optimizer_name(*optimizer);
  const auto& groups = optimizer->param_groups();
  if (groups.size() == 1) {
    rates[key] = get_learning_rate(groups[0]);
    return rates;
  }
  // Numbered from 1, as Lightning names them.
  for (size_t i = 0; i < groups.size(); ++i) {
    rates[key + "/pg" + std::to_string(i + 1)] = get_learning_rate(groups[i]);
  }
  return rates;
}

void LearningRateMonitor::on_fit_start(Trainer& trainer, Module&) {
  if (trainer.options().loggers().empty()) {
    throw std::invalid_argument(
        "LearningRateMonitor has nowhere to write: TrainerOptions loggers is empty; add \"csv\" "
        "or \"tensorboard\" to loggers, or remove the callback");
  }
  last_logged_step_ = -1;
}

// Before the step, so the row shows the rate this step uses, at the step number the Trainer gives
// the step's own metrics.
void LearningRateMonitor::on_train_batch_start(Trainer& trainer, Module&, const Batch&, int64_t) {
  if (options_.logging_interval() != "step") return;
  if ((trainer.global_step() + 1) % trainer.options().log_every_n_steps() != 0) return;
  log(trainer);
}

void LearningRateMonitor::on_train_epoch_end(Trainer& trainer, Module&) {
  if (options_.logging_interval() == "epoch") log(trainer);
}

void LearningRateMonitor::log(Trainer& trainer) {
  if (trainer.global_step() == last_logged_step_) return;
  const auto rates = learning_rates(trainer.optimizer());
  if (rates.empty()) return;
  trainer.log_metrics(rates, trainer.global_step());
  last_logged_step_ = trainer.global_step();
}

}  // namespace pipetrain
