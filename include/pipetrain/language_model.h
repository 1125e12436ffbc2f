// A decoder language model trained on next-token prediction, as GPT-2, Llama and Qwen3 are
// trained: the Module a user would otherwise write around such a Sequential. Its layers take token
// ids [B, T] (batch.data) and return logits [B, T, vocabulary]; batch.target holds the token after
// each position. Each step's loss is the chunked cross-entropy (cross_entropy.h: never holds fp32
// logits, and writes their gradient over them), logged as train_loss, val_loss and test_loss (the
// first two in the progress bar); the optimizer is pipetrain's FusedAdamW with decoupled weight
// decay on matrices and embeddings alone, under a WarmupDecayLR schedule stepped every optimizer
// step.
//
//   pipetrain::LanguageModel model(pipetrain::nn::decoder_layers(config),
//                                  pipetrain::LanguageModelOptions().lr(3e-4).warmup_steps(100)
//                                      .lr_schedule("cosine").decay_steps(5000).min_lr(3e-5));
//   trainer.fit(model, train_loader, &val_loader);
#pragma once

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "pipetrain/data.h"
#include "pipetrain/layer_spec.h"
#include "pipetrain/module.h"

namespace pipetrain {

struct LanguageModelOptions {
  typedef std::tuple<double, double> betas_t;

  // The learning rate: after warmup_steps, the peak a decaying schedule starts from.
  TORCH_ARG(double, lr) = 6e-4;
  // AdamW's decoupled decay, on parameters of two or more dimensions (matrices, embeddings) alone:
  // decaying norms' gains and biases only fights the normalisation.
  TORCH_ARG(double, weight_decay) = 0.1;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.95);
  TORCH_ARG(double, eps) = 1e-8;
  // WarmupDecayLR's: after warmup_steps of linear warmup from 0, "constant", "cosine" or "linear"
  // down to min_lr at decay_steps (cosine and linear). A constant schedule without warmup steps no
  // scheduler.
  TORCH_ARG(std::string, lr_schedule) = "constant";
  TORCH_ARG(int64_t, warmup_steps) = 0;
  TORCH_ARG(int64_t, decay_steps) = 0;
  TORCH_ARG(double, min_lr) = 0.0;
  // Whether targets may be kMaskedTarget (loss_mask.h: token files with loss masks, packed
  // documents): the loss is then the mean over the targets not masked of each optimizer step's
  // whole batch (sum_over), so that a micro-batch of few targets weighs as little as it should.
  // Without it every position is a target, and the loss skips the masking pass.
  TORCH_ARG(bool, masked_targets) = false;
};

class LanguageModel : public Module {
 public:
  explicit LanguageModel(torch::nn::Sequential layers, LanguageModelOptions options = {});
  // Built per rank (layer_spec.h): each process builds only its stages' layers.
  explicit LanguageModel(std::vector<LayerSpec> layers, LanguageModelOptions options = {});

  at::Tensor training_step(const Batch& batch, int64_t batch_idx) override;
  void validation_step(const Batch& batch, int64_t batch_idx) override;
  void test_step(const Batch& batch, int64_t batch_idx) override;
  // Two parameter groups, decayed and not (either may be empty on a stage), then the schedule.
  // Throws std::invalid_argument naming a learning rate or decay below 0, and WarmupDecayLR's
  // errors.
  OptimizerConfig configure_optimizers() override;

  // Read at every step and by configure_optimizers(), as a LibTorch module's options are.
  LanguageModelOptions options;

 protected:
  // The loss the steps return and log: the mean cross-entropy of forward(batch.data) predicting
  // batch.target (over the targets not masked, with masked_targets). Override it for a loss of
  // your own; the steps log what it returns.
  virtual at::Tensor loss(const Batch& batch);
};

}  // namespace pipetrain
