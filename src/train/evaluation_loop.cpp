#include "evaluation_loop.h"

#include <torch/torch.h>

#include <algorithm>

#include "batch_stream.h"
#include "fit_loop.h"
#include "pipetrain/callback.h"
#include "pipetrain/error.h"
#include "pipetrain/strategy.h"
#include "pipetrain/trainer.h"
#include "pipetrain/world.h"
#include "precision.h"
#include "train/progress_bar.h"

namespace pipetrain {

// --- validation and test ------------------------------------------------------------------------

EvaluationLoop::EvaluationLoop(Trainer& trainer, Module& module, const DataLoader& loader,
                               int64_t batches, bool test, bool record)
    : trainer_(trainer),
      module_(module),
      loader_(loader),
      batches_(batches),
      test_(test),
      record_(record) {}

EvaluationLoop::~EvaluationLoop() = default;

std::map<std::string, double> EvaluationLoop::run() {
  reset();
  while (!done()) advance();
  return on_run_end();
}

void EvaluationLoop::reset() {
  Trainer& t = trainer_;
  module_.layers()->eval();
  module_.run_epoch_hook(test_ ? &Module::on_test_epoch_start : &Module::on_validation_epoch_start,
                         metrics_);
  // The sanity check is invisible to callbacks: nothing it measures may count as a validation.
  if (record_) {
    call_hooks(t.options_.callbacks(),
               test_ ? &Callback::on_test_epoch_start : &Callback::on_validation_epoch_start, t,
               module_);
  }
  if (t.progress_) t.progress_->start(test_ ? "Testing" : "Validation", batches_);
  stream_ = t.batches(loader_, 0, 0, batches_);
}

void EvaluationLoop::advance() {
  Trainer& t = trainer_;
  const Batch batch = t.next_batch(*stream_);
  LoggedMetrics batch_metrics;
  try {
    PrecisionGuard precision(t.options_.precision(), t.world_->device().type());
    t.strategy_->evaluation_step(
        module_, batch, batch_idx_,
        [&](const Batch& b, int64_t i) {
          test_ ? module_.test_step(b, i) : module_.validation_step(b, i);
        },
        batch_metrics);
  } catch (const std::exception& e) {
    t.world_->publish_error(error_message(e));
    throw;
  }
  metrics_.merge(batch_metrics);
  if (record_) step_values_.push_back(batch_metrics.step_view(false));
  ++batch_idx_;
  if (t.progress_) t.progress_->update(batch_idx_, {});
}

std::map<std::string, double> EvaluationLoop::on_run_end() {
  Trainer& t = trainer_;
  // What the module's epoch-end hook log()s is one of the epoch's values, as in Lightning.
  module_.run_epoch_hook(test_ ? &Module::on_test_epoch_end : &Module::on_validation_epoch_end,
                         metrics_);
  const auto reduced = t.strategy_->reduce_metrics(metrics_.epoch_view(false));
  if (t.progress_) {
    t.progress_->log_line(batches_, values_of(reduced));
    t.progress_->finish();
  }
  auto values = values_of(reduced);
  if (!record_) return values;  // Lightning logs nothing from the sanity check
  log_step_values();
  call_hooks(t.options_.callbacks(),
             test_ ? &Callback::on_test_epoch_end : &Callback::on_validation_epoch_end, t, module_);
  t.remember(reduced);
  if (!values.empty()) {
    auto row = values;
    row["epoch"] = static_cast<double>(t.fit_progress_.epoch);
    t.log_metrics(row, std::max<int64_t>(t.fit_progress_.global_step - 1, 0));
  }
  return values;
}

// Values logged per step (on_step(true)) go to the loggers as Lightning logs them, a row a batch
// ("val_loss_step" where the value is logged per epoch too) at the count of evaluation batches of
// this kind so far. Each batch's reduction is a collective, so it runs after the epoch, where every
// rank learns in one collective whether there is anything to reduce: the last stage alone knows.
void EvaluationLoop::log_step_values() {
  Trainer& t = trainer_;
  bool any = false;
  for (const auto& values : step_values_) any = any || !values.empty();
  if (!t.world_->any(any)) return;
  int64_t& logged = test_ ? t.logged_test_batches_ : t.logged_validation_batches_;
  for (const auto& values : step_values_) {
    const auto reduced = t.strategy_->reduce_metrics(values);
    t.remember(reduced);
    if (!reduced.empty()) t.log_metrics(values_of(reduced), logged);
    ++logged;
  }
}

// --- prediction
// -----------------------------------------------------------------------------------

PredictionLoop::PredictionLoop(Trainer& trainer, Module& module, const DataLoader& loader,
                               int64_t batches)
    : trainer_(trainer), module_(module), loader_(loader), batches_(batches) {}

PredictionLoop::~PredictionLoop() = default;

std::vector<at::Tensor> PredictionLoop::run() {
  reset();
  while (!done()) advance();
  if (trainer_.progress_) trainer_.progress_->finish();
  return std::move(outputs_);
}

void PredictionLoop::reset() {
  Trainer& t = trainer_;
  module_.layers()->eval();
  if (t.progress_) t.progress_->start("Predicting", batches_);
  stream_ = t.batches(loader_, 0, 0, batches_);
}

void PredictionLoop::advance() {
  Trainer& t = trainer_;
  const Batch batch = t.next_batch(*stream_);
  PrecisionGuard precision(t.options_.precision(), t.world_->device().type());
  auto output = t.strategy_->predict_step(module_, batch, batch_idx_);
  if (t.world_->is_global_zero()) outputs_.push_back(output);
  ++batch_idx_;
  if (t.progress_) t.progress_->update(batch_idx_, {});
}

}  // namespace pipetrain
