// Lightning's EarlyStopping criteria over plain doubles: a non-finite metric stops at once, an
// improvement resets the patience count, anything else uses it up.
#include "pipetrain/early_stopping.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "callback_state.h"
#include "epoch_end_validation.h"
#include "pipetrain/trainer.h"

namespace pipetrain {
namespace {

std::string format_value(double value) {
  char buffer[48];
  std::snprintf(buffer, sizeof(buffer), "%.4g", value);
  return buffer;
}

std::string required(const std::map<std::string, std::string>& state, const std::string& key) {
  const auto it = state.find(key);
  if (it == state.end()) {
    throw std::invalid_argument(
        "EarlyStopping state has no '" + key +
        "'; the checkpoint file is damaged or was not written by pipetrain");
  }
  return it->second;
}

}  // namespace

EarlyStopping::EarlyStopping(EarlyStoppingOptions options) : options_(std::move(options)) {
  if (options_.monitor().empty()) {
    throw std::invalid_argument(
        "EarlyStopping monitor is empty; name a logged metric, e.g. monitor(\"val_loss\")");
  }
  if (options_.mode() != "min" && options_.mode() != "max") {
    throw std::invalid_argument("EarlyStopping mode must be \"min\" or \"max\" (got \"" +
                                options_.mode() + "\")");
  }
  if (options_.patience() < 0) {
    throw std::invalid_argument("EarlyStopping patience must be 0 or more checks (got " +
                                std::to_string(options_.patience()) + ")");
  }
  if (!std::isfinite(options_.min_delta()) || options_.min_delta() < 0) {
    throw std::invalid_argument("EarlyStopping min_delta must be a finite value >= 0 (got " +
                                format_value(options_.min_delta()) +
                                "); mode decides the direction");
  }
  const double inf = std::numeric_limits<double>::infinity();
  best_score_ = options_.mode() == "min" ? inf : -inf;
}

std::string EarlyStopping::state_key() const {
  return "EarlyStopping{monitor=" + options_.monitor() + ",mode=" + options_.mode() + "}";
}

std::map<std::string, std::string> EarlyStopping::state_dict() const {
  return {{"wait_count", std::to_string(wait_count_)},
          {"stopped_epoch", std::to_string(stopped_epoch_)},
          {"best_score", format_exact(best_score_)},
          {"patience", std::to_string(options_.patience())}};
}

void EarlyStopping::load_state_dict(const std::map<std::string, std::string>& state) {
  wait_count_ = parse_state_int("EarlyStopping", "wait_count", required(state, "wait_count"));
  stopped_epoch_ =
      parse_state_int("EarlyStopping", "stopped_epoch", required(state, "stopped_epoch"));
  best_score_ = parse_state_double("EarlyStopping", "best_score", required(state, "best_score"));
  // As Lightning, the saved patience wins: the resumed run stops where the original would have.
  options_.patience(parse_state_int("EarlyStopping", "patience", required(state, "patience")));
}

void EarlyStopping::on_fit_start(Trainer& trainer, Module&) {
  fitting_ = true;
  check_on_train_epoch_end_ =
      options_.check_on_train_epoch_end().value_or(validates_at_every_epoch_end(trainer.options()));
  reported_ = false;
}

void EarlyStopping::on_fit_end(Trainer&, Module&) { fitting_ = false; }

void EarlyStopping::on_train_epoch_end(Trainer& trainer, Module&) {
  if (check_on_train_epoch_end_) check(trainer);
}

void EarlyStopping::on_validation_end(Trainer& trainer, Module&) {
  if (!check_on_train_epoch_end_) check(trainer);
}

void EarlyStopping::check(Trainer& trainer) {
  // trainer.validate() runs validation hooks too; only fit is stopped. fast_dev_run is a smoke
  // test whose few batches say nothing about convergence.
  if (!fitting_ || trainer.options().fast_dev_run() > 0) return;

  const auto& metrics = trainer.callback_metrics();
  const auto it = metrics.find(options_.monitor());
  if (it == metrics.end()) {
    std::string names;
    for (const auto& entry : metrics) names += (names.empty() ? "" : ", ") + entry.first;
    throw std::invalid_argument(
        "EarlyStopping(monitor=\"" + options_.monitor() + "\") could not find \"" +
        options_.monitor() + "\" in the logged metrics: [" + names + "]; log it with log(\"" +
        options_.monitor() + "\", value) in your Module, or monitor one " + "of those");
  }
  const double current = it->second;

  bool stop = false;
  std::string reason;
  const bool minimize = options_.mode() == "min";
  if (options_.check_finite() && !std::isfinite(current)) {
    stop = true;
    reason = "Monitored metric " + options_.monitor() + " = " + format_value(current) +
             " is not finite. Previous best value was " + format_value(best_score_) +
             ". Signaling Trainer to stop.";
  } else if (minimize ? current + options_.min_delta() < best_score_
                      : current - options_.min_delta() > best_score_) {
    best_score_ = current;
    wait_count_ = 0;
  } else {
    ++wait_count_;
    if (wait_count_ >= options_.patience()) {
      stop = true;
      reason = "Monitored metric " + options_.monitor() + " did not improve in the last " +
               std::to_string(wait_count_) + " records. Best score: " + format_value(best_score_) +
               ". Signaling Trainer to stop.";
    }
  }
  if (!stop) return;
  stopped_epoch_ = trainer.current_epoch();
  trainer.request_stop();
  // min_epochs may keep fit going, and each later check asks again; say why only once.
  if (!reported_) trainer.print(reason);
  reported_ = true;
}

}  // namespace pipetrain
