// The user's side of training, as in Lightning's LightningModule: the model as a Sequential, what
// each step computes, and which optimizer to use. Step code never asks which stage it runs on:
// under the `pipe` strategy the Trainer calls the steps on the last stage once per micro-batch and
// `forward(batch.data)` there yields the pipeline's output for that micro-batch.
#pragma once

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pipetrain/data.h"
#include "pipetrain/layer_spec.h"
#include "pipetrain/lr_scheduler.h"

namespace pipetrain {

// What configure_optimizers() returns: an optimizer and, optionally, a learning-rate scheduler
// stepped every optimizer step ("step") or every epoch ("epoch").
struct OptimizerConfig {
  // Implicit, so that `return std::make_unique<torch::optim::Adam>(...);` is a whole config.
  template <typename OptimizerType>
  OptimizerConfig(std::unique_ptr<OptimizerType> optimizer)  // NOLINT(google-explicit-constructor)
      : optimizer(std::move(optimizer)) {}
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<LRScheduler> lr_scheduler;
  std::string interval = "epoch";
};

// Where a logged value goes. Unset on_step/on_epoch take Lightning's defaults: training steps log
// per step, evaluation steps per epoch. An evaluation value logged per step gets a row a batch, at
// the count of that loop's batches so far (as Lightning's).
struct LogOptions {
  TORCH_ARG(bool, prog_bar) = false;
  TORCH_ARG(std::optional<bool>, on_step) = std::nullopt;
  TORCH_ARG(std::optional<bool>, on_epoch) = std::nullopt;
};

// A logged value reduced over samples (and micro-batches, and replicas).
struct ReducedMetric {
  double value = 0;
  bool prog_bar = false;
  // The name log() was given where the row names the value with a suffix ("x" of "x_step"),
  // else empty: callback_metrics holds the value under both names, as Lightning's.
  std::string logged_name;
};
using ReducedMetrics = std::map<std::string, ReducedMetric>;

// Values logged during one step (or micro-batch), kept as weighted sums so that micro-batches and
// epochs reduce to means over samples (or, for a value from sum_over(), to the sum of its sums
// over the sum of its counts). Tensors stay tensors until means() is read: no host sync per log().
class LoggedMetrics {
 public:
  void add(const std::string& name, const at::Tensor& value, int64_t samples,
           const LogOptions& options = {});
  // A value that is `sum` / `count`, weighted by `count` (Module::sum_over).
  void add_ratio(const std::string& name, const at::Tensor& sum, const at::Tensor& count,
                 const LogOptions& options = {});
  // Adds every entry of `other` (used to gather steps into an epoch).
  void merge(const LoggedMetrics& other);
  // name -> sample-weighted mean.
  std::map<std::string, double> means() const;
  // name -> (sum of value x weight, weight): what replicas add up to reduce to a global mean.
  std::map<std::string, std::pair<double, double>> totals() const;
  ReducedMetrics reduce() const;
  // What a logging row shows, under Lightning's names: per-step values of a training step (a
  // value logged both per step and per epoch gets "_step"), or the epoch's values ("_epoch").
  // Evaluation values are per epoch unless asked otherwise.
  LoggedMetrics step_view(bool training) const;
  LoggedMetrics epoch_view(bool training) const;
  const std::map<std::string, LogOptions>& options() const { return options_; }
  // In a view: the name log() was given, for each entry the view names with a suffix.
  const std::map<std::string, std::string>& logged_names() const { return logged_names_; }
  bool empty() const { return sums_.empty(); }

 private:
  struct Sum {
    at::Tensor weighted;  // sum of value x weight, float64
    double samples = 0;   // the weight of values logged per sample
    at::Tensor counts;    // the weight of sum_over() values (float64, where they are), if any
  };
  void accumulate(const std::string& name, const Sum& sum, const LogOptions& options);
  std::map<std::string, Sum> sums_;
  std::map<std::string, LogOptions> options_;
  std::map<std::string, std::string> logged_names_;
};

class Module {
 public:
  explicit Module(torch::nn::Sequential layers);
  // A model built per rank (layer_spec.h): when the Trainer sets it up, each process builds only
  // the layers of its own stages; until then layers() holds placeholders alone.
  explicit Module(std::vector<LayerSpec> layers);
  virtual ~Module() = default;

  // One step's loss: a mean over the batch's samples, or what sum_over() returns.
  virtual at::Tensor training_step(const Batch& batch, int64_t batch_idx) = 0;
  // Evaluation steps: log() what you measure (mean over the batch's samples).
  virtual void validation_step(const Batch& batch, int64_t batch_idx);
  virtual void test_step(const Batch& batch, int64_t batch_idx);
  // The prediction for the batch's rows; by default forward(batch.data).
  virtual at::Tensor predict_step(const Batch& batch, int64_t batch_idx);
  // The optimizer over parameters(); called once the strategy has placed the model.
  virtual OptimizerConfig configure_optimizers() = 0;

  virtual void on_train_epoch_start() {}
  virtual void on_train_epoch_end() {}
  virtual void on_validation_epoch_start() {}
  virtual void on_validation_epoch_end() {}
  virtual void on_test_epoch_start() {}
  virtual void on_test_epoch_end() {}

  // The model's output for the current step's batch.data, which `input` must be (under `pipe`
  // the Trainer has computed it through the stages); any other tensor is refused.
  at::Tensor forward(const at::Tensor& input);
  // The parameters this process trains (its stage's, under `pipe`), each once even where layers
  // share one (tied weights).
  std::vector<at::Tensor> parameters() const;
  // Logs a scalar; reduced over micro-batches (and epochs) and written by rank 0. From an epoch's
  // hook (on_train_epoch_start/end, on_validation_..., on_test_...) a value of that epoch, as in
  // Lightning: one per replica, averaged over them. Anywhere else in a Trainer (predict_step,
  // configure_optimizers, a Callback's hooks) it throws std::invalid_argument rather than drop the
  // value; in a module no Trainer has set up it warns once and records nothing, as Lightning's.
  void log(const std::string& name, const at::Tensor& value, const LogOptions& options = {});
  void log(const std::string& name, double value, const LogOptions& options = {});

  // The whole model as built: every layer, or, built per rank, this process's layers with NotHeld
  // placeholders for the others'.
  torch::nn::Sequential layers() const { return layers_; }
  // True while the Trainer is training (false in validate/test/predict and sanity checks).
  bool training() const { return layers_->is_training(); }

  // --- for strategies -----------------------------------------------------------------------
  // What the step's sum_over() call recorded.
  struct SummedLoss {
    at::Tensor result;  // what sum_over() returned: sum / count, detached
    at::Tensor sum;     // with its autograd graph
    at::Tensor count;   // float64, detached
  };
  // The step's sum_over(), if it called it; forgets it.
  std::optional<SummedLoss> take_summed_loss() { return std::exchange(summed_, std::nullopt); }
  using ForwardFn = std::function<at::Tensor(const at::Tensor&)>;
  // How forward() runs and which parameters this process trains.
  void place(ForwardFn forward, torch::nn::Sequential local_layers);
  // The layers as described, where the model is built per rank; empty where it was built whole.
  const std::vector<LayerSpec>& layer_specs() const { return specs_; }
  // Builds the layers `held` names (per rank, layer_spec.h's build_layers) under `seed`, once:
  // again with the same `held` it keeps the layers as they are (trained), with another it throws.
  void build_layers(const std::vector<bool>& held, uint64_t seed);
  // The layers this process runs.
  torch::nn::Sequential local_layers() const { return local_layers_; }
  // Where log() goes while a step (or micro-batch of `samples` rows) runs; nullptr: log() throws.
  void set_log_target(LoggedMetrics* metrics, int64_t samples);
  // Runs one of the epoch hooks above (&Module::on_train_epoch_end, ...) with its log() going
  // into `metrics` as values of the epoch.
  void run_epoch_hook(void (Module::*hook)(), LoggedMetrics& metrics);

 protected:
  // The tensor to return (or log) for a loss normalised by a count of its own rather than by the
  // batch's rows, e.g. a masked mean over tokens:
  //   return sum_over(((out - y).pow(2) * mask).sum(), mask.sum());
  // Training then follows the gradient of the global sum over the global count: over every
  // micro-batch, replica and accumulated batch of the optimizer step, as one process computing
  // sum / count over all of them would; a value logged from it is that global ratio. Return (or
  // log) the result itself: a step must use it on every batch or on none.
  at::Tensor sum_over(const at::Tensor& sum, const at::Tensor& count);
  at::Tensor sum_over(const at::Tensor& sum, double count);

 private:
  std::optional<SummedLoss> summed_;
  std::vector<LayerSpec> specs_;
  std::vector<bool> built_;  // which layers build_layers built; empty before it ran
  torch::nn::Sequential layers_;
  torch::nn::Sequential local_layers_;
  ForwardFn forward_;
  bool placed_ = false;  // a strategy has placed it: a Trainer runs or ran it
  LoggedMetrics* log_target_ = nullptr;
  int64_t log_samples_ = 0;
  bool in_epoch_hook_ = false;  // log() then records per epoch
};

}  // namespace pipetrain
