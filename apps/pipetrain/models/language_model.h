// What the built-in language models (gpt, gpt2) share as Modules: next-token prediction, whose
// train_loss and val_loss are the model's loss() of a batch, both shown in the progress bar.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>

#include <pipetrain/module.h>

namespace pipetrain::cli {

// A Module of the Sequential a `Config` describes, trained at learning rate `lr`. Subclasses give
// loss() and configure_optimizers().
template <typename Config>
class LanguageModel : public Module {
 public:
  at::Tensor training_step(const Batch& batch, int64_t /*batch_idx*/) override {
    auto value = loss(batch);
    log("train_loss", value, LogOptions().prog_bar(true));
    return value;
  }
  void validation_step(const Batch& batch, int64_t /*batch_idx*/) override {
    log("val_loss", loss(batch), LogOptions().prog_bar(true));
  }

  const Config& config() const { return config_; }

 protected:
  LanguageModel(torch::nn::Sequential layers, const Config& config, double lr)
      : Module(std::move(layers)), config_(config), lr_(lr) {}

  // The mean cross-entropy of predicting batch.target (the token after each position) from
  // batch.data (token ids [B, T]).
  virtual at::Tensor loss(const Batch& batch) = 0;
  double lr() const { return lr_; }

 private:
  Config config_;
  double lr_;
};

}  // namespace pipetrain::cli
