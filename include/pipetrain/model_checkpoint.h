// Saves checkpoint files during fit and keeps the best k of them, as Lightning's ModelCheckpoint.
// Every rank runs it with the same trainer state and the same reduced metrics, so every rank
// decides alike and calls the collective Trainer::save_checkpoint with the same path; only rank 0
// deletes files that fall out of the top k.
//
// When it saves:
// - every_n_train_steps > 0: at on_train_batch_end when it divides global_step (top k and last);
//   at the end of an epoch or a validation run it then only refreshes last.ckpt.
// - otherwise, on epochs where (epoch + 1) % every_n_epochs == 0: at on_train_epoch_end where
//   validation runs once at the end of every epoch (val_check_interval 1.0,
//   check_val_every_n_epoch 1; it has run by then), so that a training epoch's values are the
//   epoch's own, as in Lightning; at on_validation_end where it runs otherwise; and at
//   on_train_epoch_end while no validation has run in this fit (no validation loader, or none
//   yet). Once validation has run, train epoch ends of other epochs no longer save, so that a
//   score is never read from a previous validation's stale metric.
// Never twice at one global step, never before the first step, never outside fit, never under
// fast_dev_run. Files are <dirpath>/epoch=E-step=S.ckpt and <dirpath>/last.ckpt; one whose name
// already exists (a rerun into the same dirpath) is overwritten.
#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/callback.h"

namespace pipetrain {

struct ModelCheckpointOptions {
  // Where the files go; empty: <trainer.log_dir()>/checkpoints (<default_root_dir>/checkpoints
  // when the Trainer has no log dir).
  TORCH_ARG(std::string, dirpath) = "";
  // The metric in trainer.callback_metrics() to rank by (also "epoch" or "step"); empty: rank by
  // recency, so save_top_k keeps the most recent files.
  TORCH_ARG(std::string, monitor) = "";
  // "min" | "max": which way is better.
  TORCH_ARG(std::string, mode) = "min";
  // How many files to keep; -1: all, 0: none (save_last still works).
  TORCH_ARG(int64_t, save_top_k) = 1;
  // Also keep <dirpath>/last.ckpt, rewritten at every save.
  TORCH_ARG(bool, save_last) = false;
  // Save every this many optimizer steps; 0: off, save by epoch instead.
  TORCH_ARG(int64_t, every_n_train_steps) = 0;
  // Save every this many epochs (when every_n_train_steps is 0); 0: only last.ckpt.
  TORCH_ARG(int64_t, every_n_epochs) = 1;
};

class ModelCheckpoint : public Callback {
 public:
  // Throws std::invalid_argument for a bad mode, save_top_k < -1 or negative every_n_*.
  explicit ModelCheckpoint(ModelCheckpointOptions options = {});

  // The best file kept so far (the most recent one without a monitor); "" before the first save.
  const std::string& best_model_path() const { return best_model_path_; }
  // Its score; empty without a monitor or before the first save.
  std::optional<double> best_model_score() const { return best_model_score_; }
  const std::string& last_model_path() const { return last_model_path_; }
  // The files kept, path -> score (the global step when there is no monitor).
  std::map<std::string, double> best_k_models() const;
  // Where files go; resolved at on_fit_start.
  const std::string& dirpath() const { return dirpath_; }
  const ModelCheckpointOptions& options() const { return options_; }

  // "ModelCheckpoint{monitor=val_loss,mode=min,every_n_train_steps=0,every_n_epochs=1}": two
  // checkpoint callbacks differing in any of these keep their own state in a checkpoint file.
  std::string state_key() const override;
  std::map<std::string, std::string> state_dict() const override;
  // Restores the bookkeeping of a resumed run. The top k, scores and last path come back only when
  // the saved dirpath is this run's (as in Lightning); otherwise only best_model_path does. Before
  // on_fit_start the state is kept and applied once dirpath is known.
  void load_state_dict(const std::map<std::string, std::string>& state) override;

  void on_fit_start(Trainer& trainer, Module& module) override;
  void on_fit_end(Trainer& trainer, Module& module) override;
  void on_train_batch_end(Trainer& trainer, Module& module, const TrainBatchOutputs& outputs,
                          const Batch& batch, int64_t batch_idx) override;
  void on_train_epoch_end(Trainer& trainer, Module& module) override;
  void on_validation_end(Trainer& trainer, Module& module) override;

 private:
  struct Kept {
    std::string path;
    double score;
  };
  bool should_skip(const Trainer& trainer) const;
  // The end of an epoch or of a validation run: top k on every_n_epochs, and last.
  void save_on_epoch_trigger(Trainer& trainer);
  void save_top_k(Trainer& trainer);
  void save_last(Trainer& trainer);
  // Whether `current` enters the top k.
  bool enters_top_k(double current) const;
  void update_best_and_save(Trainer& trainer, double current);
  void save(Trainer& trainer, const std::string& path);
  void remove(Trainer& trainer, const std::string& path) const;
  // a is better than b under `mode` (by recency: larger).
  bool better(double a, double b) const;
  // Index in kept_ of the worst (best = false) or best file; the earliest of equal scores.
  size_t find_extreme(bool best) const;
  void apply_state(const std::map<std::string, std::string>& state);

  ModelCheckpointOptions options_;
  std::string dirpath_;
  std::vector<Kept> kept_;  // in the order they were saved
  std::string best_model_path_;
  std::optional<double> best_model_score_;
  std::string last_model_path_;
  int64_t last_global_step_saved_ = 0;  // 0: nothing to save before the first step
  bool fitting_ = false;
  bool validated_in_fit_ = false;
  bool warned_missing_ = false;
  std::optional<std::map<std::string, std::string>> pending_state_;
};

}  // namespace pipetrain
