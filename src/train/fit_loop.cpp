#include "fit_loop.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>

#include "batch_stream.h"
#include "evaluation_loop.h"
#include "pipeline/tied_parameters.h"
#include "pipeline/trace.h"
#include "pipetrain/callback.h"
#include "pipetrain/checkpoint_path.h"
#include "pipetrain/error.h"
#include "pipetrain/launcher.h"
#include "pipetrain/logger.h"
#include "pipetrain/lr_scheduler.h"
#include "pipetrain/strategy.h"
#include "pipetrain/trainer.h"
#include "pipetrain/world.h"
#include "precision.h"
#include "stop_signals.h"
#include "train/progress_bar.h"
#include "train/training_plan.h"

namespace pipetrain {

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::map<std::string, double> values_of(const ReducedMetrics& metrics) {
  std::map<std::string, double> values;
  for (const auto& [name, metric] : metrics) values[name] = metric.value;
  return values;
}

namespace {

FitData fit_data(const Trainer& trainer, const DataLoader& train, const DataLoader* val,
                 FitMemory* memory) {
  const TrainerOptions& options = trainer.options();
  FitData data{train,
               val,
               options.limit_train_batches().of(train.num_batches(trainer.replicas()),
                                                "limit_train_batches"),
               val ? options.limit_val_batches().of(val->num_evaluation_batches(trainer.replicas()),
                                                    "limit_val_batches")
                   : 0,
               0,
               memory};
  const auto& interval = options.val_check_interval();
  data.val_check_batches =
      interval.is_fraction()
          ? std::max<int64_t>(1, static_cast<int64_t>(interval.value() * data.train_batches))
          : static_cast<int64_t>(interval.value());
  // Counted within an epoch: more batches than it has would never validate (Lightning refuses
  // it too).
  if (data.val_batches > 0 && data.val_check_batches > data.train_batches) {
    throw std::invalid_argument("val_check_interval " + std::to_string(data.val_check_batches) +
                                " is more than the epoch's " + std::to_string(data.train_batches) +
                                " training batches, so validation would never run: give at most " +
                                std::to_string(data.train_batches) +
                                ", or a fraction of the epoch (1.0 = its end)");
  }
  return data;
}

// "1 step", "15 steps".
std::string counted(int64_t count, const std::string& noun) {
  return std::to_string(count) + " " + noun + (count == 1 ? "" : "s");
}

// What a fit that ended at `progress` trained: its whole epochs and the batches of the one it
// stopped inside ("2 epochs and 15 of epoch 2's 128 batches"; "15 of epoch 0's 128 batches").
std::string trained_span(const FitProgress& progress, int64_t epoch_batches) {
  const std::string epochs = counted(progress.epoch, "epoch");
  if (progress.batch_idx == 0) return epochs;
  const std::string part = std::to_string(progress.batch_idx) + " of epoch " +
                           std::to_string(progress.epoch) + "'s " + std::to_string(epoch_batches) +
                           " batches";
  return progress.epoch == 0 ? part : epochs + " and " + part;
}

}  // namespace

// --- the epoch
// ------------------------------------------------------------------------------------

TrainingEpochLoop::TrainingEpochLoop(Trainer& trainer, Module& module, const FitData& data)
    : trainer_(trainer), module_(module), data_(data) {}

TrainingEpochLoop::~TrainingEpochLoop() = default;

void TrainingEpochLoop::run() {
  reset();
  while (!done()) advance();
  on_run_end();
}

void TrainingEpochLoop::reset() {
  Trainer& t = trainer_;
  module_.layers()->train();
  const int64_t first_batch = t.fit_progress_.batch_idx;
  // Also when resuming mid-epoch, as Lightning does: this process will run the epoch's end.
  module_.run_epoch_hook(&Module::on_train_epoch_start, epoch_metrics_);
  call_hooks(t.options_.callbacks(), &Callback::on_train_epoch_start, t, module_);
  if (t.progress_) {
    t.progress_->start("Epoch " + std::to_string(t.fit_progress_.epoch), data_.train_batches,
                       first_batch);
  }
  batches_ = t.batches(data_.train, t.fit_progress_.epoch, first_batch, data_.train_batches);
}

bool TrainingEpochLoop::done() const {
  return stopping_ || trainer_.fit_progress_.batch_idx >= data_.train_batches;
}

void TrainingEpochLoop::advance() {
  Trainer& t = trainer_;
  const TrainerOptions& options = t.options_;
  const int64_t batch_idx = t.fit_progress_.batch_idx;
  const auto started = std::chrono::steady_clock::now();
  const bool first_step = !data_.memory->measured;
  const Batch batch = t.next_batch(*batches_);
  call_hooks(options.callbacks(), &Callback::on_train_batch_start, t, module_, batch, batch_idx);

  const int64_t accumulate = options.accumulate_grad_batches();
  const bool last_batch = batch_idx + 1 == data_.train_batches;
  const bool steps_optimizer = (batch_idx + 1) % accumulate == 0 || last_batch;
  LoggedMetrics step_metrics;
  at::Tensor loss;
  std::optional<StepMemoryMeter> meter;  // the fit's first step says what training needs
  if (!data_.memory->measured) meter.emplace(t.world_->device());
  try {
    PrecisionGuard precision(options.precision(), t.world_->device().type());
    StepOptions step;
    step.loss_scale =
        data_.train.share(batch_idx, t.strategy_->batch_shard()) / static_cast<double>(accumulate);
    step.sync_gradients = steps_optimizer;
    loss = t.strategy_->training_step(module_, batch, batch_idx, step, step_metrics);
  } catch (const std::exception& e) {
    t.world_->publish_error(error_message(e));
    throw;
  }
  if (meter) {
    const int64_t peak = meter->peak();
    meter.reset();
    check_first_step_memory(peak);
  }
  window_metrics_.merge(step_metrics);
  epoch_metrics_.merge(step_metrics);

  if (loss.defined()) {
    const auto nonfinite = loss.isfinite().logical_not().any().to(at::kDouble);
    t.window_nonfinite_ =
        t.window_nonfinite_.defined() ? t.window_nonfinite_ + nonfinite : nonfinite;
  }
  // Every rank stops after the same optimizer step: never inside an accumulation window, whose
  // gradients a resumed run would not have.
  bool stop_after_step = false;
  const bool logs =
      steps_optimizer && (t.fit_progress_.global_step + 1) % options.log_every_n_steps() == 0;
  if (steps_optimizer) {
    // Where the host waits for the device anyway (logging, the epoch's end, the last step):
    // there a deferred check of the losses costs nothing.
    const bool host_waits =
        logs || last_batch ||
        (options.max_steps() >= 0 && t.fit_progress_.global_step + 1 >= options.max_steps());
    stop_after_step = t.agree_to_stop(batch_idx, host_waits);
  }
  // The window's step values become the latest callback metrics before the optimizer step: with
  // several ranks they are reduced here, where the stop agreement has just waited for the device.
  t.set_step_metrics(window_metrics_.step_view(true));
  if (steps_optimizer) {
    t.optimizer_step(module_);
    if (logs) {
      const ReducedMetrics& row = t.step_metrics();
      auto values = values_of(row);
      values["epoch"] = static_cast<double>(t.fit_progress_.epoch);
      t.log_metrics(values, t.fit_progress_.global_step);
      if (t.progress_) t.progress_->log_line(batch_idx + 1, t.progress_metrics_);
    }
    ++t.fit_progress_.global_step;
    window_metrics_ = LoggedMetrics();
  }
  t.fit_progress_.batch_idx = batch_idx + 1;
  if (t.plan_ && !first_step) {  // the plan's step: a batch through the pipeline, and its update
    t.planned_steps_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    ++t.planned_steps_;
  }
  if (t.progress_) t.progress_->update(batch_idx + 1, t.progress_metrics_);
  const TrainBatchOutputs outputs{loss};
  for (const auto& callback : options.callbacks()) {
    callback->on_train_batch_end(t, module_, outputs, batch, batch_idx);  // of two overloads
  }

  // As Lightning: every val_check_interval batches of the epoch (so a fraction of 1.0 means at
  // the epoch's end), in the epochs check_val_every_n_epoch picks.
  const bool validation_due =
      data_.val && data_.val_batches > 0 &&
      (t.fit_progress_.epoch + 1) % options.check_val_every_n_epoch() == 0 &&
      (batch_idx + 1) % data_.val_check_batches == 0;
  if (validation_due) {
    EvaluationLoop(t, module_, *data_.val, data_.val_batches, false, /*record=*/true).run();
    call_hooks(options.callbacks(), &Callback::on_validation_end, t, module_);
    module_.layers()->train();
    if (t.progress_ && batch_idx + 1 < data_.train_batches) {
      t.progress_->resume(batch_idx + 1, t.progress_metrics_);
    }
  }

  // The one place that decides whether fit stops: after an optimizer step, never inside an
  // accumulation window; a stop asked for (request_stop, EarlyStopping) waits for min_epochs, a
  // signal or max_time does not.
  if (!steps_optimizer) return;
  if (t.stop_requested_ && t.fit_progress_.epoch + 1 < options.min_epochs()) {
    t.stop_requested_ = false;
  }
  if (stop_after_step || t.stop_signal_ != 0) t.stop_requested_ = true;
  stopping_ = t.stop_requested_ || t.max_steps_reached();
}

void TrainingEpochLoop::check_first_step_memory(int64_t step_peak) {
  Trainer& t = trainer_;
  FitMemory& memory = *data_.memory;
  memory.measured = true;
  memory.mine.first_step_peak = step_peak;
  const auto ranks = gather_memory_figures(*t.world_, memory.mine);
  for (const auto& [name, mib] : memory_metrics(ranks)) t.callback_metrics_[name] = mib;
  bool every_rank_measured = true;
  for (const auto& rank : ranks) every_rank_measured &= rank.first_step_peak >= 0;
  if (!every_rank_measured) {
    t.print(
        "Warning: the first step's memory could not be measured (a CPU allocator of higher "
        "priority than pipetrain's counting one is installed)");
    return;
  }
  t.print(memory_table(ranks));
  if (t.plan_) {
    // Each rank runs the plan's stage of its place in its pipeline.
    std::string line = "the plan predicted, MiB:";
    const size_t stages = t.plan_->peak_bytes.size();
    for (size_t r = 0; r < ranks.size(); ++r) {
      char rank[96];
      std::snprintf(rank, sizeof rank, " %zu: %.1f (measured %.1f)", r,
                    static_cast<double>(t.plan_->peak_bytes[r % stages]) / (1 << 20),
                    static_cast<double>(ranks[r].total()) / (1 << 20));
      line += rank;
    }
    t.print(line);
  }
  check_memory_limit(ranks, t.options_.max_memory());
}

void TrainingEpochLoop::on_run_end() {
  Trainer& t = trainer_;
  if (t.progress_) t.progress_->finish();
  // Stopped mid-epoch: the epoch goes on when the run resumes, and its end with it.
  if (t.fit_progress_.batch_idx < data_.train_batches) return;

  // What the module's hook log()s is one of the epoch's values, as in Lightning.
  module_.run_epoch_hook(&Module::on_train_epoch_end, epoch_metrics_);
  const auto epoch_row = t.strategy_->reduce_metrics(epoch_metrics_.epoch_view(true));
  if (!epoch_row.empty()) {
    t.remember(epoch_row);
    auto values = values_of(epoch_row);
    values["epoch"] = static_cast<double>(t.fit_progress_.epoch);
    t.log_metrics(values, t.fit_progress_.global_step - 1);
  }
  t.fit_progress_.epoch_finished = true;
  for (auto& logger : t.loggers_) logger->save();
  call_hooks(t.options_.callbacks(), &Callback::on_train_epoch_end, t, module_);
  if (t.lr_scheduler_ && t.scheduler_interval_ == "epoch") t.lr_scheduler_->step();
  t.fit_progress_ = t.fit_progress_.next();
  if (t.fit_progress_.epoch < t.options_.min_epochs()) t.stop_requested_ = false;
}

// --- the fit
// --------------------------------------------------------------------------------------

FitLoop::FitLoop(Trainer& trainer, Module& module, const DataLoader& train, const DataLoader* val)
    : trainer_(trainer), module_(module), data_(fit_data(trainer, train, val, &memory_)) {}

FitLoop::~FitLoop() = default;

void FitLoop::run(const std::string& ckpt_path) {
  Trainer& t = trainer_;
  reset(ckpt_path);
  try {
    while (!done()) advance();
    t.check_losses_finite();  // a stop between two checks (EarlyStopping, request_stop)
  } catch (...) {
    for (auto& logger : t.loggers_) logger->save();  // what was logged up to the failure
    throw;
  }
  on_run_end();
}

void FitLoop::reset(const std::string& ckpt_path) {
  Trainer& t = trainer_;
  const TrainerOptions& options = t.options_;
  auto config = module_.configure_optimizers();
  t.optimizer_ = std::move(config.optimizer);
  t.lr_scheduler_ = std::move(config.lr_scheduler);
  t.scheduler_interval_ = config.interval;
  std::vector<at::Tensor> optimized;
  for (const auto& group : t.optimizer_->param_groups()) {
    optimized.insert(optimized.end(), group.params().begin(), group.params().end());
  }
  t.optimized_parameters_ = distinct_tensors(optimized);
  t.strategy_->setup_optimizer(*t.optimizer_);
  // What each rank will hold, said (and held against max_memory) before any step.
  memory_.mine = memory_figures(module_, *t.optimizer_);
  const auto memory = gather_memory_figures(*t.world_, memory_.mine);
  // Callbacks read the figures in callback_metrics from on_fit_start on.
  for (const auto& [name, mib] : memory_metrics(memory)) t.callback_metrics_[name] = mib;
  t.print(memory_table(memory));
  check_memory_limit(memory, options.max_memory());
  if (t.scheduler_interval_ != "step" && t.scheduler_interval_ != "epoch") {
    throw std::invalid_argument("lr scheduler interval '" + t.scheduler_interval_ +
                                "' is unknown: use step or epoch");
  }
  // As Lightning: a job restarted before its first checkpoint (--ckpt-path last) starts afresh.
  const std::string resume_from = ckpt_path == "last"
                                      ? find_last_checkpoint(options.default_root_dir())
                                      : t.resolve_checkpoint(ckpt_path);
  if (ckpt_path == "last" && resume_from.empty()) {
    t.print("Warning: --ckpt-path last: no last.ckpt under " + options.default_root_dir() +
            "/lightning_logs yet; training from the beginning");
  }
  if (!resume_from.empty()) t.restore(module_, resume_from, /*full=*/true);
  // What ran: the strategy says which of its options it used (single runs one micro-batch).
  auto hyperparameters = t.strategy_->hyperparameters();
  hyperparameters.insert({{"strategy", options.strategy()},
                          {"devices", std::to_string(options.devices())},
                          {"precision", options.precision()},
                          {"seed", std::to_string(options.seed())}});
  for (auto& logger : t.loggers_) logger->log_hyperparams(hyperparameters);

  call_hooks(options.callbacks(), &Callback::on_fit_start, t, module_);
  if (data_.val && data_.val_batches > 0 && options.num_sanity_val_steps() > 0) {
    EvaluationLoop(t, module_, *data_.val,
                   std::min(options.num_sanity_val_steps(), data_.val_batches), false,
                   /*record=*/false)
        .run();
  }

  t.fit_start_seconds_ = now_seconds();
  t.stop_requested_ = false;
  t.stop_signal_ = 0;
  t.window_nonfinite_ = at::Tensor();  // a fit that failed mid-window leaves nothing behind
  t.first_nonfinite_step_ = at::Tensor();
  t.unchecked_steps_.clear();
  signals_ = std::make_unique<StopSignals>();
  if (options.pipe().trace()) options.pipe().trace()->start(*t.world_);
}

bool FitLoop::done() const {
  const Trainer& t = trainer_;
  return t.fit_progress_.epoch >= t.options_.max_epochs() || t.stop_requested_ ||
         t.max_steps_reached();
}

void FitLoop::advance() { TrainingEpochLoop(trainer_, module_, data_).run(); }

void FitLoop::on_run_end() {
  Trainer& t = trainer_;
  const TrainerOptions& options = t.options_;
  log_peak_memory();  // before on_fit_end, whose callbacks find it in callback_metrics
  // A fit stopped mid-epoch (max_steps, max_time, a signal, request_stop) has not run the epoch's
  // end, where checkpoints are saved: ModelCheckpoint saves last.ckpt here, and after a signal
  // the Trainer saves one itself if nothing did, so a restarted job continues where it stopped.
  call_hooks(options.callbacks(), &Callback::on_fit_end, t, module_);
  if (t.stop_signal_ != 0 && options.enable_checkpointing() && options.fast_dev_run() == 0 &&
      t.last_saved_step_ != t.fit_progress_.global_step) {
    t.save_checkpoint((std::filesystem::path(t.log_dir_) / "checkpoints" / "last.ckpt").string());
  }
  if (t.stop_signal_ != 0) {
    t.print("pipetrain: stopped by " + signal_name(t.stop_signal_) + " after step " +
            std::to_string(t.fit_progress_.global_step) +
            "; resume with --ckpt-path last (ckpt_path=\"last\")");
  }
  if (t.plan_ && t.planned_steps_ > 0) {
    char line[160];
    std::snprintf(line, sizeof line,
                  "the plan predicted a step of %.1f ms; measured %.1f ms (rank 0, mean of %lld "
                  "batches after the first)",
                  t.plan_->step_seconds * 1e3,
                  t.planned_steps_seconds_ / static_cast<double>(t.planned_steps_) * 1e3,
                  static_cast<long long>(t.planned_steps_));
    t.print(line);
  }
  for (auto& logger : t.loggers_) logger->save();
  if (!t.loggers_.empty()) {
    t.print("trained " + counted(t.fit_progress_.global_step, "step") + " in " +
            trained_span(t.fit_progress_, data_.train_batches) + "; metrics and checkpoints in " +
            t.log_dir_);
  }
  if (options.pipe().trace()) {
    options.pipe().trace()->write(*t.world_, options.trace());
    t.print("trace written to " + options.trace() + " (open it in https://ui.perfetto.dev)");
  }
  t.world_->barrier();
}

void FitLoop::log_peak_memory() {
  Trainer& t = trainer_;
  auto peaks = at::zeros({t.world_->size()}, at::kDouble);
  peaks[t.world_->rank()] = static_cast<double>(peak_memory_bytes(t.world_->device()));
  const auto all = t.world_->all_reduce_sum(peaks.to(t.world_->device()));
  std::map<std::string, double> values;
  std::string line = "peak memory per rank, MiB:";
  for (size_t rank = 0; rank < all.size(); ++rank) {
    const double mib = all[rank] / (1 << 20);
    values["peak_memory_mib/rank_" + std::to_string(rank)] = mib;
    t.callback_metrics_["peak_memory_mib/rank_" + std::to_string(rank)] = mib;
    line += " " + std::to_string(rank) + ": " + std::to_string(static_cast<int64_t>(mib));
  }
  t.log_metrics(values, std::max<int64_t>(0, t.fit_progress_.global_step - 1));
  t.print(line);
}

}  // namespace pipetrain
