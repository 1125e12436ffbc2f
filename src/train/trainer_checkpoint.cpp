// The Trainer's checkpoint files: what a save writes and a resume reads back, so that a fit
// resumed from a checkpoint trains as if it had never stopped, under any layout. Whatever a save
// cannot hold exactly it refuses, saying why, rather than writing a file that resumes differently.
// What the files are is checkpoint_io.h's; which process holds which weights and optimizer state
// is the strategy's; here is what goes into a checkpoint of a fit, and where a resumed fit stands.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "pipeline/recompute.h"
#include "pipetrain/callback.h"
#include "pipetrain/checkpoint_io.h"
#include "pipetrain/checkpoint_path.h"
#include "pipetrain/error.h"
#include "pipetrain/logger.h"
#include "pipetrain/lr_scheduler.h"
#include "pipetrain/module.h"
#include "pipetrain/strategy.h"
#include "pipetrain/trainer.h"
#include "pipetrain/world.h"
#include "train/optimizer_state.h"

namespace pipetrain {
namespace fs = std::filesystem;
namespace {

// Removes `folder` when the scope it guards ends by an exception; an empty `folder` is kept.
class RemovedOnFailure {
 public:
  explicit RemovedOnFailure(std::string folder)
      : folder_(std::move(folder)), exceptions_(std::uncaught_exceptions()) {}
  RemovedOnFailure(const RemovedOnFailure&) = delete;
  RemovedOnFailure& operator=(const RemovedOnFailure&) = delete;
  ~RemovedOnFailure() {
    if (folder_.empty() || std::uncaught_exceptions() == exceptions_) return;
    std::error_code ignored;
    fs::remove_all(folder_, ignored);
  }

 private:
  std::string folder_;
  int exceptions_;
};

// Removes the `.ckpt.partial` folders in `folder`: saves killed before they finished (a finished
// save renames its folder; a failed one removes it), which nothing reads.
void remove_unfinished_saves(const fs::path& folder) {
  const std::string suffix = ".ckpt.partial";
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(folder, error)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        entry.is_directory(error)) {
      fs::remove_all(entry.path(), error);
    }
  }
}

// The run folder of a Trainer that has trained, logged and saved nothing yet, which it gives up
// when the checkpoint it was given cannot be used (every failed attempt left an empty version_N
// behind); empty for one that has, and on other ranks than the first.
std::string unused_run_folder(bool global_zero, int64_t saved_step, int64_t global_step,
                              bool logged, const std::string& log_dir) {
  return global_zero && saved_step < 0 && global_step == 0 && !logged ? log_dir : std::string();
}

// This rank's parameters under their names in the whole model ("3.weight"), each once: a tensor
// several layers share goes by its first name, on every stage that holds it, and so does a copy of
// a tied parameter (`tied`, Strategy::tied_names), so that its optimizer state is found under any
// layout.
NamedParameters named_parameters(const Module& module,
                                 const std::map<std::string, std::string>& tied) {
  std::map<const c10::TensorImpl*, std::string> first_name;
  for (const auto& item : module.layers()->named_parameters()) {
    first_name.emplace(item.value().unsafeGetTensorImpl(), item.key());
  }
  NamedParameters named;
  std::set<const c10::TensorImpl*> seen;
  for (const auto& item : module.local_layers()->named_parameters()) {
    const auto* impl = item.value().unsafeGetTensorImpl();
    if (!seen.insert(impl).second) continue;
    const auto it = first_name.find(impl);
    std::string name = it == first_name.end() ? item.key() : it->second;
    if (const auto tie = tied.find(name); tie != tied.end()) name = tie->second;
    named.emplace_back(std::move(name), item.value());
  }
  return named;
}

// `named` split into lists in which each name appears once: the first holds each name's first
// tensor, the next the copies of a tied parameter that one process holds twice (their optimizer
// states are equal: one is saved, and each copy loads it).
std::vector<NamedParameters> by_distinct_names(const NamedParameters& named) {
  std::vector<NamedParameters> lists;
  std::map<std::string, size_t> count;
  for (const auto& item : named) {
    const size_t list = count[item.first]++;
    if (lists.size() <= list) lists.resize(list + 1);
    lists[list].push_back(item);
  }
  return lists;
}

// `named` with each name once, for saving: the name's first tensor that `optimizer` steps, else its
// first. Under ZeRO a process holding two copies of a tie may own (and hold the state of) the
// second alone; the copies' states are equal, and each copy loads the one saved.
NamedParameters saved_once(const NamedParameters& named, const torch::optim::Optimizer& optimizer) {
  std::set<const c10::TensorImpl*> stepped;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& parameter : group.params()) stepped.insert(parameter.unsafeGetTensorImpl());
  }
  NamedParameters once;
  std::map<std::string, size_t> index_of;
  for (const auto& item : named) {
    const auto [it, first] = index_of.emplace(item.first, once.size());
    if (first) {
      once.push_back(item);
    } else if (!stepped.count(once[it->second].second.unsafeGetTensorImpl()) &&
               stepped.count(item.second.unsafeGetTensorImpl())) {
      once[it->second] = item;
    }
  }
  return once;
}

}  // namespace

void Trainer::save_checkpoint(const std::string& path) {
  // The optimizer, the scheduler and the data position come from fit and outlive it, so a save
  // after fit returns is as whole as one during it; before any fit they do not exist.
  if (!optimizer_) {
    throw std::logic_error(
        "save_checkpoint(" + path +
        "): this Trainer has not run fit(), and a checkpoint holds a fit's optimizer, "
        "learning-rate scheduler and data position beside the weights, so that fit resumes from "
        "it exactly; call it during or after fit()");
  }
  check_losses_finite();  // no checkpoint holds an update from a loss that was not finite
  for (auto& logger : loggers_) logger->save();  // the logs are at least as new as the checkpoint
  TrainingState state;
  state.progress = fit_progress_;
  state.progress.batch_idx = resumable_batch();
  state.data = data_position();
  state.world_size = world_->size();
  state.layout = strategy_->layout();
  state.lr_scheduler_steps = lr_scheduler_ ? lr_scheduler_->step_count() : -1;
  // Saved from on_train_epoch_end, the epoch's scheduler step is still to come: count it, since
  // the resumed run starts with the next epoch.
  if (lr_scheduler_ && fit_progress_.epoch_finished && scheduler_interval_ == "epoch") {
    ++state.lr_scheduler_steps;
  }
  if (lr_scheduler_) state.lr_scheduler_lrs = lr_scheduler_->lrs_at(state.lr_scheduler_steps);
  for (const auto& callback : options_.callbacks()) {
    if (!callback->state_key().empty()) {
      state.callbacks[callback->state_key()] = callback->state_dict();
    }
  }
  const CheckpointWriters writers{world_->rank(), [&] { world_->barrier(); },
                                  [&](const std::string& error) { world_->publish_error(error); }};
  write_checkpoint(writers, path, strategy_->weight_shard(*module_), state, [&] {
    torch::serialize::OutputArchive archive;
    // Replicas holding the same state leave it to the first replica's ranks.
    if (strategy_->saves_optimizer_state()) {
      torch::serialize::OutputArchive optimizer_archive;
      save_optimizer_state(
          *optimizer_, saved_once(named_parameters(*module_, strategy_->tied_names()), *optimizer_),
          optimizer_archive);
      archive.write("optimizer", optimizer_archive);
    }
    // Every generator the run draws from: dropout on a GPU draws from the device's.
    const RngState generators = RngState::capture(world_->device());
    archive.write("cpu_rng_state", generators.cpu_state());
    if (generators.device_state().defined()) {
      archive.write("cuda_rng_state", generators.device_state());
    }
    // Into memory: torch's file writer aborts the process when a write fails.
    std::ostringstream bytes;
    archive.save_to(bytes);
    return bytes.str();
  });
  last_checkpoint_ = path;
  last_saved_step_ = fit_progress_.global_step;
}

std::string Trainer::resolve_checkpoint(const std::string& ckpt_path) const {
  const RemovedOnFailure unused(unused_run_folder(world_->is_global_zero(), last_saved_step_,
                                                  fit_progress_.global_step, logged_metrics_,
                                                  log_dir_));
  return resolve_checkpoint_path(ckpt_path, options_.default_root_dir());
}

void Trainer::restore(Module& module, const std::string& path, bool full) {
  const RemovedOnFailure unused(unused_run_folder(world_->is_global_zero(), last_saved_step_,
                                                  fit_progress_.global_step, logged_metrics_,
                                                  log_dir_));
  // Everything is read and checked before anything is changed.
  const TrainingState state = read_training_state(path);
  const StoredWeights weights(path);
  auto read_rank_file = [&](int64_t rank) {
    const auto rank_file = checkpoint_rank_path(path, rank);
    torch::serialize::InputArchive archive;
    try {
      archive.load_from(rank_file);
    } catch (const std::exception& e) {
      throw std::runtime_error("checkpoint " + path + ": cannot read " + rank_file + " (" +
                               error_message(e) + ")");
    }
    return archive;
  };
  // The optimizer state of this rank's parameters, from the files the strategy says hold it (any
  // layout resumes any other); the generator from this rank's own file, under the same layout.
  const bool same_layout =
      state.layout == strategy_->layout() && state.world_size == world_->size();
  std::vector<torch::serialize::InputArchive> archives;
  torch::serialize::InputArchive own;
  if (full) {
    for (const int64_t rank :
         strategy_->optimizer_state_ranks(state.layout, state.world_size, world_->rank())) {
      archives.push_back(read_rank_file(rank));
    }
    if (same_layout) own = read_rank_file(world_->rank());
  }
  strategy_->load_weights(module, weights);
  if (!full) return;

  const auto parameters = by_distinct_names(named_parameters(module, strategy_->tied_names()));
  for (auto& archive : archives) {
    torch::serialize::InputArchive optimizer_archive;
    if (archive.try_read("optimizer", optimizer_archive)) {
      for (const auto& distinct : parameters) {
        load_optimizer_state(*optimizer_, distinct, optimizer_archive);
      }
    }
  }
  at::Tensor rng_state;
  if (same_layout && own.try_read("cpu_rng_state", rng_state)) {
    at::Tensor device_rng_state;
    if (world_->device().is_cuda()) own.try_read("cuda_rng_state", device_rng_state);
    RngState::from(rng_state, world_->device(), device_rng_state).restore();
  }
  if (state.lr_scheduler_steps >= 0) {
    check_same_schedule(state, path);
    if (lr_scheduler_) lr_scheduler_->set_step_count(state.lr_scheduler_steps);
  }
  for (auto& callback : options_.callbacks()) {
    const auto it = state.callbacks.find(callback->state_key());
    if (it != state.callbacks.end()) callback->load_state_dict(it->second);
  }
  fit_progress_ = state.progress.next();
  if (state.data && !state.progress.epoch_finished) {
    fit_progress_.batch_idx = resumed_batch(*state.data, path);
  }
  // The fit goes on from the run that wrote `path`, whose killed saves no one will finish.
  if (world_->is_global_zero()) remove_unfinished_saves(fs::path(path).parent_path());
}

// Inside an accumulation window (a checkpoint saved at a validation every N batches, N not a
// multiple of accumulate_grad_batches, or by a callback) the weights are still those from before
// the window, and the gradients it has accumulated are not saved: the resumed fit starts at the
// window's first batch and accumulates all of it again. Windows start at multiples of
// accumulate_grad_batches (resumed_batch refuses any other start); the epoch's last batch closes
// one whatever its length.
int64_t Trainer::resumable_batch() const {
  const int64_t batch = fit_progress_.batch_idx;
  if (batch >= training_data_->batches) return batch;
  return batch - batch % options_.accumulate_grad_batches();
}

// A scheduler resumes from its step count alone: one of another schedule (a decay over another
// --max-steps, another --lr, warmup or --min-lr) would jump from the rates the run stopped at,
// which the checkpoint records, to its own, and so would a run with no scheduler (the command's
// --lr-schedule constant) at the optimizer's own rates. Where both give the same rates there, it
// goes on.
void Trainer::check_same_schedule(const TrainingState& state, const std::string& path) const {
  std::vector<double> now;
  if (lr_scheduler_) {
    now = lr_scheduler_->lrs_at(state.lr_scheduler_steps);
  } else {
    for (const auto& group : optimizer_->param_groups()) now.push_back(get_learning_rate(group));
  }
  const std::vector<double>& saved = state.lr_scheduler_lrs;
  if (saved.empty()) return;  // a checkpoint written before the rates were recorded
  bool same = saved.size() == now.size();
  for (size_t i = 0; same && i < saved.size(); ++i) {
    same = std::abs(saved[i] - now[i]) <= 1e-9 * std::max(std::abs(saved[i]), std::abs(now[i]));
  }
  if (same) return;
  const auto list = [](const std::vector<double>& lrs) {
    std::ostringstream text;
    for (size_t i = 0; i < lrs.size(); ++i) text << (i ? ", " : "") << lrs[i];
    return text.str();
  };
  throw std::invalid_argument(
      "checkpoint " + path + " stopped at learning-rate scheduler step " +
      std::to_string(state.lr_scheduler_steps) + " with learning rates " + list(saved) +
      ", and this run's schedule gives " + list(now) +
      " there: resume with the schedule it was trained with (the pipetrain command: the same "
      "--lr, --lr-schedule, --warmup-steps and --min-lr, and --decay-steps set to the first run's "
      "--max-steps to train on past it)");
}

DataPosition Trainer::data_position() const {
  DataPosition position = training_data_->order;
  position.samples =
      std::min(resumable_batch() * training_data_->batch_size * replicas(), position.dataset_size);
  return position;
}

int64_t Trainer::resumed_batch(const DataPosition& saved, const std::string& path) const {
  const DataPosition& now = training_data_->order;
  auto refuse = [&](const std::string& what) {
    throw std::invalid_argument("checkpoint " + path + " stopped mid-epoch " +
                                std::to_string(fit_progress_.epoch) + " after " +
                                std::to_string(saved.samples) + " samples, but " + what +
                                ": the resumed run would not see the batches it had left");
  };
  if (saved.dataset_size != now.dataset_size) {
    refuse("its training data had " + std::to_string(saved.dataset_size) +
           " examples and this has " + std::to_string(now.dataset_size));
  }
  if (saved.shuffle != now.shuffle || (saved.shuffle && saved.seed != now.seed)) {
    refuse("its data order came from shuffle " + std::string(saved.shuffle ? "on" : "off") +
           ", seed " + std::to_string(saved.seed) + " and this loader's from shuffle " +
           (now.shuffle ? "on" : "off") + ", seed " + std::to_string(now.seed) +
           " (DataLoaderOptions::seed, --seed)");
  }
  // The epoch's order does not depend on the layout; a different number of replicas (or batch
  // size) continues from the same sample where its global batch divides what was done.
  const int64_t batch_size = training_data_->batch_size;
  const int64_t global_batch = batch_size * replicas();
  if (saved.samples >= saved.dataset_size) return training_data_->batches;
  if (saved.samples % global_batch != 0) {
    refuse("a global batch here is " + std::to_string(global_batch) + " samples (batch size " +
           std::to_string(batch_size) + " x " + std::to_string(replicas()) +
           " replicas), which does not divide it; resume with a global batch that divides " +
           std::to_string(saved.samples));
  }
  const int64_t batch = saved.samples / global_batch;
  // After the epoch's last batch (of those limit_train_batches leaves), whose window closed there.
  if (batch >= training_data_->batches) return batch;
  const int64_t accumulate = options_.accumulate_grad_batches();
  if (batch % accumulate != 0) {
    // A window starting here would close at the next multiple, short of its batches, and the
    // step would still divide the sum by accumulate_grad_batches.
    throw std::invalid_argument(
        "checkpoint " + path + " resumes epoch " + std::to_string(fit_progress_.epoch) +
        " at batch " + std::to_string(batch) + ", which does not start an accumulation window of " +
        std::to_string(accumulate) +
        " batches (accumulate_grad_batches, --accumulate-grad-batches)"
        ": resume with an accumulate_grad_batches that divides " +
        std::to_string(batch) + ", or from a checkpoint saved at another batch");
  }
  return batch;
}

}  // namespace pipetrain
