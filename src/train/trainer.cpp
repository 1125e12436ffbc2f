// THE TRAINING LOOP MUST READ EASILY. Placement, micro-batching and communication belong to the
// strategy; logging to the loggers; decisions about saving and stopping to the callbacks. This file
// only says what happens in which order.
#include "pipetrain/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <utility>

#include "batch_stream.h"
#include "evaluation_loop.h"
#include "fit_loop.h"
#include "pipeline/trace.h"
#include "pipetrain/callback.h"
#include "pipetrain/cluster_environment.h"
#include "pipetrain/csv_logger.h"
#include "pipetrain/error.h"
#include "pipetrain/fused_adamw.h"
#include "pipetrain/launcher.h"
#include "pipetrain/logger.h"
#include "pipetrain/lr_scheduler.h"
#include "pipetrain/model_checkpoint.h"
#include "pipetrain/module.h"
#include "pipetrain/strategy.h"
#include "pipetrain/tensorboard_logger.h"
#include "pipetrain/world.h"
#include "precision.h"
#include "stop_signals.h"
#include "train/progress_bar.h"
#include "train/training_plan.h"

namespace pipetrain {
namespace fs = std::filesystem;
namespace {

// "val_check_interval (--val-check-interval)": an option as the library and the command name it.
std::string option_name(const std::string& name, std::string flag = "") {
  if (flag.empty()) {
    flag = "--" + name;
    std::replace(flag.begin(), flag.end(), '_', '-');
  }
  return name + " (" + flag + ")";
}

void check_options(const TrainerOptions& options) {
  auto at_least = [](double value, double minimum, const char* name, const char* flag = "") {
    if (value < minimum) {
      std::ostringstream message;
      message << option_name(name, flag) << " must be at least " << minimum << " (got " << value
              << ")";
      throw std::invalid_argument(message.str());
    }
  };
  at_least(options.devices(), 1, "devices");
  at_least(options.num_nodes(), 1, "num_nodes");
  at_least(options.stages(), 0, "stages");
  at_least(options.pipe().chunks(), 1, "chunks");
  at_least(options.log_every_n_steps(), 1, "log_every_n_steps");
  if (options.accelerator() != "cpu" && options.accelerator() != "cuda" &&
      options.accelerator() != "auto") {
    throw std::invalid_argument("unknown accelerator '" + options.accelerator() +
                                "': use cpu, cuda or auto");
  }
  at_least(options.accumulate_grad_batches(), 1, "accumulate_grad_batches");
  at_least(options.check_val_every_n_epoch(), 1, "check_val_every_n_epoch");
  at_least(options.num_sanity_val_steps(), 0, "num_sanity_val_steps");
  at_least(options.max_epochs(), 0, "max_epochs");
  at_least(options.min_epochs(), 0, "min_epochs");
  at_least(options.max_steps(), -1, "max_steps");
  at_least(options.max_time(), 0, "max_time");
  at_least(options.gradient_clip_val(), 0, "gradient_clip_val");
  at_least(options.fast_dev_run(), 0, "fast_dev_run");
  at_least(options.timeout_seconds(), 1, "timeout_seconds", "--timeout");
  // A count of 0 would validate never, dividing by zero; a fraction of 0 is rounded up to 1 batch.
  const auto& interval = options.val_check_interval();
  if (interval.value() <= 0) {
    throw std::invalid_argument(option_name("val_check_interval") +
                                " must be a count of at least 1 batch or a fraction in (0, 1] of "
                                "an epoch (got " +
                                interval.to_string() + ")");
  }
  validate_precision(options.precision());
  if (options.gradient_clip_algorithm() != "norm" && options.gradient_clip_algorithm() != "value") {
    throw std::invalid_argument("unknown gradient_clip_algorithm '" +
                                options.gradient_clip_algorithm() + "': use norm or value");
  }
  for (const auto& name : options.loggers()) {
    if (name != "csv" && name != "tensorboard") {
      throw std::invalid_argument("unknown logger '" + name + "': use csv, tensorboard or both");
    }
  }
}

// Checked options, and those that turn into other options: fast_dev_run is Lightning's smoke
// test.
TrainerOptions resolve(TrainerOptions options) {
  check_options(options);
  // Checkpoint callbacks run last (as in Lightning), so a file holds the others' latest state.
  auto callbacks = options.callbacks();
  std::stable_partition(callbacks.begin(), callbacks.end(), [](const auto& callback) {
    return dynamic_cast<const ModelCheckpoint*>(callback.get()) == nullptr;
  });
  options.callbacks(callbacks);
  if (!options.trace().empty()) options.pipe().trace(std::make_shared<Trace>());
  if (options.fast_dev_run() > 0) {
    const int64_t n = options.fast_dev_run();
    options.max_epochs(1).max_steps(n).num_sanity_val_steps(0).enable_checkpointing(false);
    options.limit_train_batches(BatchLimit::count(n)).limit_val_batches(BatchLimit::count(n));
    options.limit_test_batches(BatchLimit::count(n)).limit_predict_batches(BatchLimit::count(n));
    options.val_check_interval(BatchLimit::fraction(1.0)).loggers({});
  }
  return options;
}

// What validate and test share once the weights are in place: one evaluation run over `limit`
// of the loader's batches, whose records every logger then saves.
std::map<std::string, double> evaluate(Trainer& trainer, Module& module, const DataLoader& loader,
                                       const BatchLimit& limit, bool test,
                                       const std::vector<std::unique_ptr<Logger>>& loggers) {
  const int64_t batches = limit.of(loader.num_evaluation_batches(trainer.replicas()),
                                   test ? "limit_test_batches" : "limit_val_batches");
  const auto metrics =
      EvaluationLoop(trainer, module, loader, batches, test, /*record=*/true).run();
  for (auto& logger : loggers) logger->save();
  return metrics;
}

}  // namespace

Trainer::Trainer(TrainerOptions options)
    : options_(resolve(std::move(options))),
      strategy_(create_strategy(options_.strategy(), options_)) {
  const auto env = select_cluster_environment();
  const int64_t needed = strategy_->world_size();
  if (env->world_size() == 1 && needed > 1) {
    throw std::logic_error(
        "strategy '" + options_.strategy() + "' needs " + std::to_string(needed) +
        " processes, and this one was started alone: call pipetrain::launch_ranks(options) at "
        "the start of main (it runs the program once per rank and returns their exit status), "
        "or start the ranks with torchrun or srun");
  }
  if (env->world_size() != needed) {
    throw std::invalid_argument("strategy '" + options_.strategy() + "' with devices " +
                                std::to_string(options_.devices()) + " needs " +
                                std::to_string(needed) + " processes, but the launcher (" +
                                env->name() + ") started " + std::to_string(env->world_size()) +
                                ": make --devices match the number of processes");
  }
  const bool cuda = options_.accelerator() == "cuda" ||
                    (options_.accelerator() == "auto" && torch::cuda::is_available());
  world_ = World::connect(*env, std::chrono::seconds(options_.timeout_seconds()),
                          cuda ? c10::DeviceType::CUDA : c10::DeviceType::CPU);
  if (options_.deterministic()) at::globalContext().setDeterministicAlgorithms(true, false);
  torch::manual_seed(options_.seed());

  // Every rank agrees on the log directory (checkpoints go inside it); rank 0 writes to it.
  std::string version;
  if (world_->is_global_zero()) {
    version = std::to_string(claim_log_version(options_.default_root_dir()));
  }
  version = world_->broadcast(version);
  log_dir_ =
      (fs::path(options_.default_root_dir()) / "lightning_logs" / ("version_" + version)).string();
  if (world_->is_global_zero()) {
    for (const auto& name : options_.loggers()) {
      if (name == "csv") {
        loggers_.push_back(std::make_unique<CSVLogger>(options_.default_root_dir(),
                                                       "lightning_logs", std::stoll(version)));
      } else {
        loggers_.push_back(std::make_unique<TensorBoardLogger>(
            options_.default_root_dir(), "lightning_logs", std::stoll(version)));
      }
    }
    if (options_.enable_progress_bar()) {
      progress_ = std::make_unique<ProgressBar>(ProgressBar::stdout_is_tty());
    }
  }
}

Trainer::~Trainer() = default;

std::optional<int> launch_ranks(const TrainerOptions& options) {
  check_options(options);
  const int64_t needed = create_strategy(options.strategy(), options)->world_size();
  if (needed == 1 || select_cluster_environment()->world_size() > 1) return std::nullopt;
  // Nobody launched the ranks: start this node's share of them (Lightning's manual multi-node
  // launch reads NODE_RANK, MASTER_ADDR and MASTER_PORT when num_nodes > 1).
  if (needed % options.num_nodes() != 0) {
    throw std::invalid_argument("strategy '" + options.strategy() + "' needs " +
                                std::to_string(needed) + " processes, which " +
                                std::to_string(options.num_nodes()) +
                                " nodes cannot share evenly: change --num-nodes");
  }
  LaunchOptions launch = multi_node_launch_options(needed / options.num_nodes(),
                                                   options.num_nodes(), current_environment());
  // A signal to the launcher reaches the ranks, which finish their step and save last.ckpt: they
  // get as long as any wait of theirs may take.
  launch.signal_grace_period = std::chrono::seconds(options.timeout_seconds());
  return launch_local_processes(launch);
}

bool Trainer::is_global_zero() const { return world_->is_global_zero(); }

int64_t Trainer::replicas() const { return strategy_->batch_shard().replicas; }

std::unique_ptr<BatchStream> Trainer::batches(const DataLoader& loader, int64_t epoch,
                                              int64_t first, int64_t end) const {
  return std::make_unique<BatchStream>(loader, epoch, first, end, strategy_->batch_shard(),
                                       options_.precision(), world_->device());
}

Batch Trainer::next_batch(BatchStream& batches) const {
  try {
    return batches.next();
  } catch (const std::exception& e) {
    world_->publish_error(error_message(e));
    throw;
  }
}

void Trainer::print(const std::string& message) const {
  if (!world_->is_global_zero()) return;
  if (progress_) {
    progress_->print(message);
  } else {
    std::cout << message << std::endl;
  }
}

void Trainer::log_metrics(const std::map<std::string, double>& metrics, int64_t step) {
  // Loggers buffer rows and write them in batches (as Lightning's flush_logs_every_n_steps);
  // the Trainer makes them durable at epoch ends, checkpoints and the end of each loop.
  for (auto& logger : loggers_) logger->log_metrics(metrics, step);
  logged_metrics_ = true;
}

void Trainer::log_text(const std::string& tag, const std::string& text, int64_t step) {
  for (auto& logger : loggers_) logger->log_text(tag, text, step);
  logged_metrics_ = true;
}

void Trainer::setup(Module& module) {
  if (module_ == &module) return;
  if (module_ != nullptr) {
    throw std::logic_error("a Trainer serves one Module; make a new Trainer for another model");
  }
  try {
    if (!module.layer_specs().empty()) strategy_->build_layers(module, *world_, options_.seed());
    auto layers = module.layers();
    convert_module(layers, options_.precision());
    strategy_->setup(module, world_);
  } catch (const std::exception& e) {
    world_->publish_error(error_message(e));
    throw;
  }
  module_ = &module;
  print(strategy_->describe());
  for (const std::string& warning : strategy_->warnings()) print(warning);
}

// --- fit -----------------------------------------------------------------------------------------

void Trainer::fit(Module& module, const DataLoader& train_loader, const DataLoader* val_loader,
                  const std::string& ckpt_path) {
  if (options_.plan() && module_ == nullptr) choose_pipeline_plan(module, train_loader);
  strategy_->check_data(train_loader);
  setup(module);
  // Kept once fit returns (the loader may not be): a checkpoint saved then says where the data is.
  // The epoch's batches as limit_train_batches leaves them: a checkpoint saved after the last of
  // them stands at the epoch's end, not inside an accumulation window.
  training_data_ =
      TrainingData{train_loader.batch_size(),
                   options_.limit_train_batches().of(train_loader.num_batches(replicas()),
                                                     "limit_train_batches"),
                   DataPosition{0, train_loader.options().seed(), train_loader.options().shuffle(),
                                train_loader.dataset_size()}};
  FitLoop(*this, module, train_loader, val_loader).run(ckpt_path);
}

void Trainer::optimizer_step(Module& module) {
  // As Lightning's: the hook sees the gradients before they are clipped.
  call_hooks(options_.callbacks(), &Callback::on_before_optimizer_step, *this, module);
  if (options_.gradient_clip_val() > 0) {
    const double clip = options_.gradient_clip_val();
    torch::NoGradGuard no_grad;
    if (options_.gradient_clip_algorithm() == "norm") {
      // The norm over every stage, as clip_grad_norm_ over the optimizer's parameters would
      // compute it in one process (a parameter the optimizer does not train keeps its gradient
      // out of it, as in Lightning); gradients are divided by max(1, norm / clip)
      // (clip_grad_norm_ multiplies them by its inverse), which stays on the device: a divisor of
      // 1 leaves a gradient as it is.
      const auto divisor =
          ((strategy_->gradient_norm(optimized_parameters_) + 1e-6) / clip).clamp_min(1.0);
      divide_gradients_before_step(*optimizer_, divisor);
    } else {
      for (auto& p : optimized_parameters_) {
        if (p.grad().defined()) p.grad().clamp_(-clip, clip);
      }
    }
  }
  Trace::Span span(options_.pipe().trace().get(), "optimizer");
  strategy_->optimizer_step(*optimizer_);
  optimizer_->zero_grad();
  if (lr_scheduler_ && scheduler_interval_ == "step") lr_scheduler_->step();
}

// --- metrics -------------------------------------------------------------------------------------

// Filling callback_metrics after every batch has a price: reducing a step's values reads them on
// the host (a wait for the device) and, with several ranks, is a collective every rank must call at
// the same point. In one process the values wait, unreduced on the device, until something reads
// them (a callback, a logging step): a fit whose callbacks read no metrics per batch pays nothing.
// With several ranks any rank may read them at any moment, so every rank reduces them after every
// batch at the same point of the loop; on a batch that steps the optimizer that is right after the
// stop agreement, whose host wait it shares, so what it adds there is the reduction's collectives
// alone; a batch inside an accumulation window pays a host wait of its own.
void Trainer::set_step_metrics(const LoggedMetrics& step_view) {
  unreduced_step_metrics_ = step_view;
  if (world_->size() > 1) step_metrics();
}

const ReducedMetrics& Trainer::step_metrics() const {
  if (unreduced_step_metrics_) {
    step_metrics_ =
        strategy_->reduce_metrics(*std::exchange(unreduced_step_metrics_, std::nullopt));
    remember(step_metrics_);
  }
  return step_metrics_;
}

void Trainer::remember(const ReducedMetrics& metrics) const {
  step_metrics();  // values still unreduced are older than these
  for (const auto& [name, metric] : metrics) {
    callback_metrics_[name] = metric.value;
    if (!metric.logged_name.empty()) callback_metrics_[metric.logged_name] = metric.value;
    if (metric.prog_bar) progress_metrics_[name] = metric.value;
  }
}

const std::map<std::string, double>& Trainer::callback_metrics() const {
  step_metrics();
  return callback_metrics_;
}

bool Trainer::max_steps_reached() const {
  return options_.max_steps() >= 0 && fit_progress_.global_step >= options_.max_steps();
}

bool Trainer::agree_to_stop(int64_t batch_idx, bool host_waits) {
  const bool time_is_up =
      options_.max_time() > 0 && now_seconds() - fit_start_seconds_ >= options_.max_time();
  const double signal = StopSignals::received();
  const int64_t accumulate = options_.accumulate_grad_batches();
  if (options_.stop_on_nonfinite_loss()) {
    unchecked_steps_[fit_progress_.global_step] = {fit_progress_.epoch,
                                                   batch_idx - (batch_idx % accumulate), batch_idx};
  }
  at::Tensor nonfinite = window_nonfinite_.defined()
                             ? window_nonfinite_.reshape({1})
                             : at::zeros({1}, at::TensorOptions(at::kDouble));
  window_nonfinite_ = at::Tensor();
  std::vector<double> agreed{time_is_up ? 1.0 : 0.0, signal, signal > 0 ? 1.0 : 0.0};
  if (world_->size() == 1) {
    // Nothing to agree on: the host reads the device only where it waits for it anyway, and
    // meanwhile remembers (on the device) the first step whose loss was not finite.
    if (options_.stop_on_nonfinite_loss()) {
      const auto step = static_cast<double>(fit_progress_.global_step);
      const auto first = first_nonfinite_step_.defined()
                             ? first_nonfinite_step_
                             : at::full({1}, -1.0, nonfinite.options().dtype(at::kDouble));
      first_nonfinite_step_ =
          at::where(first.lt(0).logical_and(nonfinite.gt(0)), at::full_like(first, step), first);
      if (host_waits || time_is_up || signal > 0) check_losses_finite();
    }
  } else {
    // One collective for all: the flags, and whether any rank's loss of this step was not finite.
    const auto flags =
        at::cat({at::tensor(agreed, at::TensorOptions(at::kDouble)).to(nonfinite.device()),
                 options_.stop_on_nonfinite_loss()
                     ? nonfinite.to(at::kDouble)
                     : at::zeros({1}, nonfinite.options().dtype(at::kDouble))});
    agreed = world_->all_reduce_sum(flags);
    if (agreed[3] > 0) throw_nonfinite_loss(fit_progress_.global_step);
    unchecked_steps_.clear();
  }
  // The signal itself: this rank's, or the one the ranks that got one agree on (SIGTERM if they
  // got different ones).
  if (agreed[2] > 0) {
    const double mean = agreed[1] / agreed[2];
    stop_signal_ = StopSignals::received() != 0 ? StopSignals::received()
                   : mean == SIGUSR1            ? SIGUSR1
                                                : SIGTERM;
  }
  return agreed[0] > 0 || agreed[2] > 0;
}

void Trainer::check_losses_finite() {
  if (!first_nonfinite_step_.defined()) return;
  const auto first = static_cast<int64_t>(first_nonfinite_step_.item<double>());
  if (first >= 0) throw_nonfinite_loss(first);
  unchecked_steps_.clear();
}

void Trainer::throw_nonfinite_loss(int64_t step) const {
  const auto where = unchecked_steps_.find(step);
  const auto [epoch, first, last] = where != unchecked_steps_.end()
                                        ? where->second
                                        : std::array<int64_t, 3>{fit_progress_.epoch, -1, -1};
  std::string message = "the loss of step " + std::to_string(step) + " (epoch " +
                        std::to_string(epoch) + ", batch " +
                        (first == last ? std::to_string(first)
                                       : std::to_string(first) + ".." + std::to_string(last)) +
                        ") is NaN or infinite; training stopped ";
  message += step == fit_progress_.global_step
                 ? "before that step's optimizer step, so no weights saved hold it. "
                 : "at step " + std::to_string(fit_progress_.global_step) +
                       ", before any checkpoint held an update from it. ";
  message += last_checkpoint_.empty() ? "No checkpoint was saved in this run. "
                                      : "The last checkpoint saved is " + last_checkpoint_ +
                                            " (step " + std::to_string(last_saved_step_) + "). ";
  message +=
      "Lower the learning rate, clip gradients (--gradient-clip-val) or check the data; "
      "stop_on_nonfinite_loss(false) (--stop-on-nonfinite-loss false) trains on regardless";
  throw std::runtime_error(message);
}

// --- validate, test, predict --------------------------------------------------------------------

std::map<std::string, double> Trainer::validate(Module& module, const DataLoader& loader,
                                                const std::string& ckpt_path) {
  setup(module);
  if (!ckpt_path.empty()) restore(module, resolve_checkpoint(ckpt_path), /*full=*/false);
  return evaluate(*this, module, loader, options_.limit_val_batches(), /*test=*/false, loggers_);
}

std::map<std::string, double> Trainer::test(Module& module, const DataLoader& loader,
                                            const std::string& ckpt_path) {
  setup(module);
  if (!ckpt_path.empty()) restore(module, resolve_checkpoint(ckpt_path), /*full=*/false);
  return evaluate(*this, module, loader, options_.limit_test_batches(), /*test=*/true, loggers_);
}

std::vector<at::Tensor> Trainer::predict(Module& module, const DataLoader& loader,
                                         const std::string& ckpt_path) {
  setup(module);
  if (!ckpt_path.empty()) restore(module, resolve_checkpoint(ckpt_path), /*full=*/false);
  return PredictionLoop(*this, module, loader,
                        options_.limit_predict_batches().of(
                            loader.num_evaluation_batches(replicas()), "limit_predict_batches"))
      .run();
}

}  // namespace pipetrain
