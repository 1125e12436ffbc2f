// Lightning's ModelCheckpoint bookkeeping (top k by score, last.ckpt, one save per step) over the
// collective Trainer::save_checkpoint. Decisions use only state that is identical on every rank, so
// no rank ever waits in a save the others skipped.
#include "pipetrain/model_checkpoint.h"

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <system_error>

#include "callback_state.h"
#include "epoch_end_validation.h"
#include "pipetrain/trainer.h"

namespace pipetrain {
namespace {

namespace fs = std::filesystem;

std::string get(const std::map<std::string, std::string>& state, const std::string& key) {
  const auto it = state.find(key);
  return it == state.end() ? std::string() : it->second;
}

// What a monitor may name: every logged metric, plus "epoch" and "step" as Lightning adds them.
std::map<std::string, double> monitor_candidates(const Trainer& trainer) {
  auto candidates = trainer.callback_metrics();
  candidates.emplace("epoch", static_cast<double>(trainer.current_epoch()));
  candidates.emplace("step", static_cast<double>(trainer.global_step()));
  return candidates;
}

std::string missing_metric_message(const std::string& monitor,
                                   const std::map<std::string, double>& candidates) {
  std::string names;
  for (const auto& entry : candidates) names += (names.empty() ? "" : ", ") + entry.first;
  return "ModelCheckpoint(monitor=\"" + monitor + "\") could not find \"" + monitor +
         "\" in the logged metrics: [" + names + "]; log it with log(\"" + monitor +
         "\", value) in your Module, or monitor one of those";
}

std::string checkpoint_dir(const Trainer& trainer, const std::string& dirpath) {
  fs::path path;
  if (!dirpath.empty()) {
    path = dirpath;
  } else if (!trainer.log_dir().empty()) {
    path = fs::path(trainer.log_dir()) / "checkpoints";
  } else {
    path = fs::path(trainer.options().default_root_dir()) / "checkpoints";
  }
  // Absolute, so that a resumed run recognises its own directory and removal stays inside it.
  return fs::absolute(path).lexically_normal().string();
}

}  // namespace

ModelCheckpoint::ModelCheckpoint(ModelCheckpointOptions options) : options_(std::move(options)) {
  if (options_.mode() != "min" && options_.mode() != "max") {
    throw std::invalid_argument("ModelCheckpoint mode must be \"min\" or \"max\" (got \"" +
                                options_.mode() + "\")");
  }
  if (options_.save_top_k() < -1) {
    throw std::invalid_argument(
        "ModelCheckpoint save_top_k must be -1 (keep all), 0 (none) or a "
        "positive count (got " +
        std::to_string(options_.save_top_k()) + ")");
  }
  if (options_.every_n_train_steps() < 0) {
    throw std::invalid_argument(
        "ModelCheckpoint every_n_train_steps must be 0 (off) or positive "
        "(got " +
        std::to_string(options_.every_n_train_steps()) + ")");
  }
  if (options_.every_n_epochs() < 0) {
    throw std::invalid_argument(
        "ModelCheckpoint every_n_epochs must be 0 (only last.ckpt) or "
        "positive (got " +
        std::to_string(options_.every_n_epochs()) + ")");
  }
}

std::map<std::string, double> ModelCheckpoint::best_k_models() const {
  std::map<std::string, double> models;
  for (const auto& kept : kept_) models[kept.path] = kept.score;
  return models;
}

std::string ModelCheckpoint::state_key() const {
  return "ModelCheckpoint{monitor=" + options_.monitor() + ",mode=" + options_.mode() +
         ",every_n_train_steps=" + std::to_string(options_.every_n_train_steps()) +
         ",every_n_epochs=" + std::to_string(options_.every_n_epochs()) + "}";
}

std::map<std::string, std::string> ModelCheckpoint::state_dict() const {
  std::map<std::string, std::string> state;
  state["monitor"] = options_.monitor();
  state["mode"] = options_.mode();
  state["dirpath"] = dirpath_;
  state["best_model_path"] = best_model_path_;
  state["best_model_score"] = best_model_score_ ? format_exact(*best_model_score_) : "";
  state["last_model_path"] = last_model_path_;
  state["last_global_step_saved"] = std::to_string(last_global_step_saved_);
  // Indexed keys keep the save order, which breaks ties between equal scores.
  state["top_k_count"] = std::to_string(kept_.size());
  for (size_t i = 0; i < kept_.size(); ++i) {
    state["top_k_path_" + std::to_string(i)] = kept_[i].path;
    state["top_k_score_" + std::to_string(i)] = format_exact(kept_[i].score);
  }
  return state;
}

void ModelCheckpoint::load_state_dict(const std::map<std::string, std::string>& state) {
  if (fitting_) {
    apply_state(state);
  } else {
    pending_state_ = state;
  }
}

void ModelCheckpoint::apply_state(const std::map<std::string, std::string>& state) {
  best_model_path_ = get(state, "best_model_path");
  if (get(state, "dirpath") != dirpath_) return;

  const std::string score = get(state, "best_model_score");
  best_model_score_.reset();
  if (!score.empty())
    best_model_score_ = parse_state_double("ModelCheckpoint", "best_model_score", score);
  last_model_path_ = get(state, "last_model_path");
  const std::string last_step = get(state, "last_global_step_saved");
  if (!last_step.empty())
    last_global_step_saved_ =
        parse_state_int("ModelCheckpoint", "last_global_step_saved", last_step);
  kept_.clear();
  const std::string count_text = get(state, "top_k_count");
  const int64_t count =
      count_text.empty() ? 0 : parse_state_int("ModelCheckpoint", "top_k_count", count_text);
  for (int64_t i = 0; i < count; ++i) {
    const std::string score_key = "top_k_score_" + std::to_string(i);
    kept_.push_back({get(state, "top_k_path_" + std::to_string(i)),
                     parse_state_double("ModelCheckpoint", score_key, get(state, score_key))});
  }
}

void ModelCheckpoint::on_fit_start(Trainer& trainer, Module&) {
  dirpath_ = checkpoint_dir(trainer, options_.dirpath());
  fitting_ = true;
  validated_in_fit_ = false;
  warned_missing_ = false;
  if (pending_state_) {
    if (get(*pending_state_, "dirpath") != dirpath_) {
      trainer.print("ModelCheckpoint: the checkpoint directory changed from " +
                    get(*pending_state_, "dirpath") + " to " + dirpath_ +
                    "; only best_model_path is restored, the top-k bookkeeping starts afresh");
    }
    apply_state(*pending_state_);
    pending_state_.reset();
  }
  std::error_code error;
  if (options_.save_top_k() != 0 && fs::is_directory(dirpath_, error) &&
      !fs::is_empty(dirpath_, error) && kept_.empty()) {
    trainer.print("ModelCheckpoint: checkpoint directory " + dirpath_ +
                  " exists and is not empty; files of the same name will be overwritten");
  }
}

void ModelCheckpoint::on_fit_end(Trainer& trainer, Module&) {
  // A fit stopped between the epoch ends that save (max_steps or a signal mid-epoch) keeps its
  // last steps: last.ckpt resumes exactly there.
  if (!should_skip(trainer)) save_last(trainer);
  fitting_ = false;
}

void ModelCheckpoint::on_train_batch_end(Trainer& trainer, Module&, const TrainBatchOutputs&,
                                         const Batch&, int64_t) {
  const int64_t every = options_.every_n_train_steps();
  if (should_skip(trainer) || every < 1 || trainer.global_step() % every != 0) return;
  save_top_k(trainer);
  save_last(trainer);
}

void ModelCheckpoint::on_train_epoch_end(Trainer& trainer, Module&) {
  // Once validation has run, it triggers epoch saves unless it runs at every epoch's end (see
  // the header).
  if ((validated_in_fit_ && !validates_at_every_epoch_end(trainer.options())) ||
      should_skip(trainer)) {
    return;
  }
  save_on_epoch_trigger(trainer);
}

void ModelCheckpoint::on_validation_end(Trainer& trainer, Module&) {
  if (!fitting_) return;  // trainer.validate(): nothing to save
  validated_in_fit_ = true;
  if (validates_at_every_epoch_end(trainer.options()) || should_skip(trainer)) return;
  save_on_epoch_trigger(trainer);
}

bool ModelCheckpoint::should_skip(const Trainer& trainer) const {
  return !fitting_ || trainer.options().fast_dev_run() > 0 ||
         trainer.global_step() == last_global_step_saved_;
}

void ModelCheckpoint::save_on_epoch_trigger(Trainer& trainer) {
  const int64_t every = options_.every_n_epochs();
  if (options_.every_n_train_steps() == 0 && every >= 1 &&
      (trainer.current_epoch() + 1) % every == 0) {
    save_top_k(trainer);
  }
  save_last(trainer);
}

void ModelCheckpoint::save_top_k(Trainer& trainer) {
  if (options_.save_top_k() == 0) return;
  if (options_.monitor().empty()) {
    // By recency: the step is the score, and larger is better.
    update_best_and_save(trainer, static_cast<double>(trainer.global_step()));
    return;
  }
  const auto candidates = monitor_candidates(trainer);
  const auto it = candidates.find(options_.monitor());
  if (it == candidates.end()) {
    // As Lightning: an error once validation has run (the metric should be there by now), a
    // warning before, when a validation metric may simply not have been computed yet.
    const std::string message = missing_metric_message(options_.monitor(), candidates);
    if (validated_in_fit_) throw std::invalid_argument(message);
    if (!warned_missing_) trainer.print("Warning: " + message + "; no top-k file saved yet");
    warned_missing_ = true;
    return;
  }
  if (enters_top_k(it->second)) update_best_and_save(trainer, it->second);
}

void ModelCheckpoint::save_last(Trainer& trainer) {
  if (!options_.save_last()) return;
  // Set before saving: this callback's state is part of the file.
  last_model_path_ = (fs::path(dirpath_) / "last.ckpt").string();
  save(trainer, last_model_path_);
}

bool ModelCheckpoint::better(double a, double b) const {
  const bool larger_is_better = options_.monitor().empty() || options_.mode() == "max";
  return larger_is_better ? a > b : a < b;
}

size_t ModelCheckpoint::find_extreme(bool best) const {
  size_t found = 0;
  for (size_t i = 1; i < kept_.size(); ++i) {
    const bool replaces = best ? better(kept_[i].score, kept_[found].score)
                               : better(kept_[found].score, kept_[i].score);
    if (replaces) found = i;
  }
  return found;
}

bool ModelCheckpoint::enters_top_k(double current) const {
  const int64_t k = options_.save_top_k();
  if (k == -1 || static_cast<int64_t>(kept_.size()) < k) return true;
  // NaN compares false: it never displaces a kept file.
  return better(current, kept_[find_extreme(/*best=*/false)].score);
}

void ModelCheckpoint::update_best_and_save(Trainer& trainer, double current) {
  const int64_t k =
      options_.save_top_k() == -1 ? static_cast<int64_t>(kept_.size()) + 1 : options_.save_top_k();
  std::string dropped;
  if (static_cast<int64_t>(kept_.size()) >= k && !kept_.empty()) {
    const size_t worst = find_extreme(/*best=*/false);
    dropped = kept_[worst].path;
    kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(worst));
  }
  // A NaN score is kept as the worst possible one, so that it is the first to go.
  if (std::isnan(current)) {
    const bool larger_is_better = options_.mode() == "max";
    current = larger_is_better ? -std::numeric_limits<double>::infinity()
                               : std::numeric_limits<double>::infinity();
  }
  const std::string path =
      (fs::path(dirpath_) / ("epoch=" + std::to_string(trainer.current_epoch()) +
                             "-step=" + std::to_string(trainer.global_step()) + ".ckpt"))
          .string();
  kept_.push_back({path, current});

  // Set before saving: this callback's state is part of the file.
  const Kept& best = kept_[find_extreme(/*best=*/true)];
  best_model_path_ = best.path;
  if (options_.monitor().empty()) {
    best_model_score_.reset();
  } else {
    best_model_score_ = best.score;
  }
  save(trainer, path);
  if (!dropped.empty() && dropped != path) remove(trainer, dropped);
}

void ModelCheckpoint::save(Trainer& trainer, const std::string& path) {
  // Every rank: on machines without a shared disk each writes into its own directory.
  std::error_code ignored;
  fs::create_directories(dirpath_, ignored);
  trainer.save_checkpoint(path);
  last_global_step_saved_ = trainer.global_step();
}

void ModelCheckpoint::remove(Trainer& trainer, const std::string& path) const {
  if (!trainer.is_global_zero()) return;
  // Only files this callback wrote into its directory: never a checkpoint file elsewhere (such
  // as one restored from an earlier run's directory).
  if (fs::path(path).lexically_normal().parent_path() != fs::path(dirpath_)) return;
  std::error_code error;
  fs::remove_all(path, error);
  if (error) {
    trainer.print("Warning: ModelCheckpoint could not remove " + path + ": " + error.message());
  }
}

}  // namespace pipetrain
