// The small models tests train through the Trainer: a tanh MLP, a Module stepped by SGD at a fixed
// learning rate, and a regression by mean squared error.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "pipetrain/module.h"

namespace pipetrain::testing {

// Linear layers of the given widths (inputs, hidden..., outputs), a Tanh between each two.
torch::nn::Sequential tanh_mlp(const std::vector<int64_t>& widths);

// A Module whose optimizer is SGD over its parameters() at `learning_rate`, with `momentum`.
class SgdModule : public Module {
 public:
  SgdModule(torch::nn::Sequential layers, double learning_rate, double momentum = 0);
  OptimizerConfig configure_optimizers() override;

 private:
  double learning_rate_;
  double momentum_;
};

// Regression onto batch.target: the mean squared error of forward(batch.data), logged as
// train_loss.
class MseRegression : public SgdModule {
 public:
  using SgdModule::SgdModule;
  at::Tensor training_step(const Batch& batch, int64_t batch_idx) override;
};

}  // namespace pipetrain::testing
