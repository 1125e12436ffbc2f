// The Trainer: Lightning's loops (fit, validate, test, predict) for a pipetrain Module, under any
// strategy. Options keep Lightning's names (trainer_options.h).
//
//   int main() {
//     const auto options = pipetrain::TrainerOptions().strategy("pipe").devices(2).max_epochs(3);
//     if (const auto status = pipetrain::launch_ranks(options)) return *status;
//     pipetrain::Trainer trainer(options);  // joins the other ranks, seeds
//     MyModule model;                       // build after the Trainer: every rank alike
//     trainer.fit(model, train_loader, &val_loader);
//   }
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/optim/optimizer.h>

#include "pipetrain/checkpoint_io.h"
#include "pipetrain/data.h"
#include "pipetrain/module.h"
#include "pipetrain/trainer_options.h"

namespace pipetrain {

class BatchStream;
class Callback;
class Logger;
class LRScheduler;
class ProgressBar;
class Strategy;
class World;
struct TrainingPlan;

// When `options` asks for more processes than were launched (no torchrun or SLURM variables),
// runs this program once per rank of this node, as torchrun would, and returns their exit status
// once they are done (the launching process then trains nothing); otherwise returns nothing, and
// this process goes on as a rank. Call it first in main, before any work a rank would repeat.
std::optional<int> launch_ranks(const TrainerOptions& options);

class Trainer {
 public:
  // Joins the run's ranks (launched by launch_ranks, torchrun or SLURM), then seeds the default
  // generator with `seed`. Throws std::logic_error when `options` needs more processes than were
  // started.
  explicit Trainer(TrainerOptions options);
  ~Trainer();

  // `ckpt_path`: a checkpoint file to resume from, or "last" for the newest one of this root dir.
  void fit(Module& module, const DataLoader& train_loader, const DataLoader* val_loader = nullptr,
           const std::string& ckpt_path = "");
  // Each returns the epoch's metrics (on every rank). `ckpt_path` loads weights first.
  std::map<std::string, double> validate(Module& module, const DataLoader& loader,
                                         const std::string& ckpt_path = "");
  std::map<std::string, double> test(Module& module, const DataLoader& loader,
                                     const std::string& ckpt_path = "");
  // predict_step's outputs, one tensor per batch in input order, on rank 0 (empty elsewhere).
  std::vector<at::Tensor> predict(Module& module, const DataLoader& loader,
                                  const std::string& ckpt_path = "");

  // Writes a checkpoint file (a `.ckpt` folder) atomically: the weights and all a fit resumes
  // exactly from (optimizer, scheduler, loop and data position, callbacks' state), during fit or
  // after it returns. Every rank must call it. Throws std::logic_error before this Trainer's first
  // fit, which is what has that state.
  void save_checkpoint(const std::string& path);
  // `ckpt_path` itself, or for "last" / "best" the checkpoint it names under default_root_dir
  // (resolve_checkpoint_path, checkpoint_path.h).
  std::string resolve_checkpoint(const std::string& ckpt_path) const;
  // Stops fit after the optimizer step in progress (honouring min_epochs), as
  // `trainer.should_stop = True`.
  void request_stop() { stop_requested_ = true; }
  // The signal (SIGTERM, SIGUSR1) that stopped the last fit, 0 if none did. fit() returns
  // normally after one, with last.ckpt saved; the command then exits with 128 + the signal.
  int stopped_by_signal() const { return stop_signal_; }
  // Rank 0 prints `message` without tearing the progress bar; other ranks print nothing.
  void print(const std::string& message) const;
  // Rank 0 writes `metrics` at `step` to every logger.
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step);
  // Rank 0 writes `text` under `tag` at `step` to every logger that keeps text (Logger::log_text).
  void log_text(const std::string& tag, const std::string& text, int64_t step);

  int64_t global_step() const { return fit_progress_.global_step; }
  int64_t current_epoch() const { return fit_progress_.epoch; }
  // Where fit is (what a checkpoint saved now would resume from).
  const FitProgress& fit_progress() const { return fit_progress_; }
  bool is_global_zero() const;
  const World& world() const { return *world_; }
  // Data-parallel replicas of the model (1 without data parallelism).
  int64_t replicas() const;
  const TrainerOptions& options() const { return options_; }
  // The latest value of every logged metric, reduced (the same on every rank): after each
  // training batch, what the training steps logged over the accumulation window so far; after an
  // epoch or a validation run, its values. A value logged both per step and per epoch is there
  // as "x_step" or "x_epoch" and, as in Lightning, as "x": the latest of the two. Each rank's
  // memory in MiB: parameter_, gradient_ and optimizer_state_memory_mib/rank_<r> from fit's
  // start, first_step_peak_memory_mib/rank_<r> after its first step, peak_memory_mib/rank_<r>
  // from its end.
  const std::map<std::string, double>& callback_metrics() const;
  // <default_root_dir>/lightning_logs/version_<N> of this run (every rank knows it).
  const std::string& log_dir() const { return log_dir_; }
  // The optimizer and scheduler of the running fit, or of the last one once it returned (null
  // before the first).
  torch::optim::Optimizer* optimizer() const { return optimizer_.get(); }
  LRScheduler* lr_scheduler() const { return lr_scheduler_.get(); }

 private:
  // Batches [first, end) of `epoch` as this process reads them, prepared ahead.
  std::unique_ptr<BatchStream> batches(const DataLoader& loader, int64_t epoch, int64_t first,
                                       int64_t end) const;
  // The stream's next batch; a failure to read it is published to the other ranks.
  Batch next_batch(BatchStream& batches) const;
  // The loops (src/train/fit_loop.h, evaluation_loop.h) run on the Trainer's state, as
  // Lightning's on `self.trainer`.
  friend class FitLoop;
  friend class TrainingEpochLoop;
  friend class EvaluationLoop;
  friend class PredictionLoop;
  void setup(Module& module);
  // Before the first setup, under TrainerOptions::plan: the planner's plan (rank 0's, or the
  // file's) becomes pipe's options on every rank (src/train/trainer_plan.cpp).
  void choose_pipeline_plan(Module& module, const DataLoader& loader);
  void optimizer_step(Module& module);
  bool max_steps_reached() const;
  // Collective, before each optimizer step: whether fit stops after it (max_time ran out, a stop
  // signal reached any rank). Throws on every rank when a loss of the step was not finite.
  // In one process the loss check is deferred to steps where `host_waits` (or a save).
  bool agree_to_stop(int64_t batch_idx, bool host_waits);
  // Throws the error of a loss that was not finite since the last check (one process).
  void check_losses_finite();
  [[noreturn]] void throw_nonfinite_loss(int64_t step) const;

  // Metrics (src/train/trainer.cpp). After each training batch: the step values of the window so
  // far, as a logging row would show them, become the latest callback metrics; reduced at once
  // with several ranks, when first read in one process.
  void set_step_metrics(const LoggedMetrics& step_view);
  // Those values reduced, for a logging row.
  const ReducedMetrics& step_metrics() const;
  // Keeps reduced metrics for callbacks (all) and the progress bar (those logged with prog_bar).
  void remember(const ReducedMetrics& metrics) const;

  // Checkpoint files (src/train/trainer_checkpoint.cpp).
  // Loads `path` into `module`: its weights, and when `full` (fit resuming) all the rest.
  void restore(Module& module, const std::string& path, bool full);
  // The batch a checkpoint resumes from, and the training data's position there; where a resumed
  // fit continues from it.
  int64_t resumable_batch() const;
  DataPosition data_position() const;
  int64_t resumed_batch(const DataPosition& saved, const std::string& path) const;
  void check_same_schedule(const TrainingState& state, const std::string& path) const;

  TrainerOptions options_;
  std::unique_ptr<Strategy> strategy_;
  std::shared_ptr<World> world_;
  std::vector<std::unique_ptr<Logger>> loggers_;
  std::unique_ptr<ProgressBar> progress_;
  std::string log_dir_;
  Module* module_ = nullptr;
  // The plan this run trains under (TrainerOptions::plan); null without one. Its first step's
  // memory and the mean of its later steps' times are printed beside its predictions.
  std::unique_ptr<TrainingPlan> plan_;
  double planned_steps_seconds_ = 0;
  int64_t planned_steps_ = 0;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  // What configure_optimizers gave the optimizer, each once, before any strategy shared it out:
  // what gradient clipping covers, as Lightning's clips the optimizer's parameters.
  std::vector<at::Tensor> optimized_parameters_;
  std::unique_ptr<LRScheduler> lr_scheduler_;
  std::string scheduler_interval_ = "epoch";
  // Filled lazily (step_metrics, callback_metrics): a cache behind const accessors.
  mutable std::optional<LoggedMetrics> unreduced_step_metrics_;
  mutable ReducedMetrics step_metrics_;
  mutable std::map<std::string, double> callback_metrics_;
  mutable std::map<std::string, double> progress_metrics_;

  FitProgress fit_progress_;
  // What the last fit trained on, kept after it returns for a checkpoint saved then: the loader's
  // batch size and batches per epoch, and its order (DataPosition::samples unused).
  struct TrainingData {
    int64_t batch_size = 0;
    int64_t batches = 0;
    DataPosition order;
  };
  std::optional<TrainingData> training_data_;
  bool stop_requested_ = false;
  int stop_signal_ = 0;
  at::Tensor window_nonfinite_;      // losses of this optimizer step that were not finite (device)
  at::Tensor first_nonfinite_step_;  // one process: the first such step since the fit began, or -1
  // Steps not yet checked: global step -> (epoch, first batch, last batch), for the error.
  std::map<int64_t, std::array<int64_t, 3>> unchecked_steps_;
  // A row went to the loggers: the run folder holds what was measured.
  bool logged_metrics_ = false;
  // Evaluation batches whose per-step values (log(..., on_step(true))) were logged, counted over
  // this Trainer's validations and tests apart: the step those values are logged at.
  int64_t logged_validation_batches_ = 0;
  int64_t logged_test_batches_ = 0;
  std::string last_checkpoint_;  // the last checkpoint this Trainer saved, and at which step
  int64_t last_saved_step_ = -1;
  bool set_up_ = false;
  double fit_start_seconds_ = 0;
};

}  // namespace pipetrain
