// The user's side of training, as in Lightning's LightningModule: the model as a Sequential, what
// one step computes, and which optimizer to use. Step code never asks which stage it runs on: under
// the `pipe` strategy the Trainer calls training_step on the last stage once per micro-batch and
// `forward(batch.data)` there yields the pipeline's output for that micro-batch.
#pragma once

#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/data.h"

namespace pipetrain {

// Values logged during one step, kept as sample-weighted sums so that micro-batches (and, later,
// replicas) reduce to the mean over the whole batch. Tensors stay tensors: no host sync per log().
class LoggedMetrics {
 public:
  void add(const std::string& name, const at::Tensor& value, int64_t samples);
  // name -> sample-weighted mean.
  std::map<std::string, double> means() const;
  bool empty() const { return sums_.empty(); }

 private:
  struct Sum {
    at::Tensor weighted;  // sum of value * samples
    int64_t samples = 0;
  };
  std::map<std::string, Sum> sums_;
};

class Module {
 public:
  explicit Module(torch::nn::Sequential layers);
  virtual ~Module() = default;

  // One step's loss (mean over the batch's samples).
  virtual at::Tensor training_step(const Batch& batch, int64_t batch_idx) = 0;
  // The optimizer over parameters(); called once the strategy has placed the model.
  virtual std::unique_ptr<torch::optim::Optimizer> configure_optimizers() = 0;

  // The model's output for `input` (the current step's batch.data).
  at::Tensor forward(const at::Tensor& input);
  // The parameters this process trains (its stage's, under `pipe`).
  std::vector<at::Tensor> parameters() const;
  // Logs a scalar for this step; reduced over micro-batches and written by rank 0.
  void log(const std::string& name, const at::Tensor& value);
  void log(const std::string& name, double value);

  // The whole model as built (every rank builds all of it).
  torch::nn::Sequential layers() const { return layers_; }

  // --- for strategies -----------------------------------------------------------------------
  using ForwardFn = std::function<at::Tensor(const at::Tensor&)>;
  // How forward() runs and which parameters this process trains.
  void place(ForwardFn forward, torch::nn::Sequential local_layers);
  // Where log() goes while a step (or micro-batch of `samples` rows) runs; nullptr to drop.
  void set_log_target(LoggedMetrics* metrics, int64_t samples);

 private:
  torch::nn::Sequential layers_;
  torch::nn::Sequential local_layers_;
  ForwardFn forward_;
  LoggedMetrics* log_target_ = nullptr;
  int64_t log_samples_ = 0;
};

}  // namespace pipetrain
