// What the built-in language models (gpt, gpt2, llama, qwen3) share as Modules: next-token
// prediction, whose train_loss and val_loss are the model's loss() of a batch, both shown in the
// progress bar; and the recipe of their optimizer.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <pipetrain/cross_entropy.h>
#include <pipetrain/loss_mask.h>
#include <pipetrain/module.h>

namespace pipetrain::cli {

// How gpt2, llama and qwen3 train: AdamW (betas 0.9, 0.95, eps 1e-8; pipetrain's fused one) with
// decoupled weight decay on matrices and embeddings alone (decaying norms' gains and biases only
// fights the normalisation), and the learning rate's schedule.
struct OptimizerRecipe {
  double lr = 6e-4;
  double weight_decay = 0.1;
  std::string lr_schedule = "constant";  // constant, cosine or linear, after the warmup
  int64_t warmup_steps = 0;
  double min_lr = 0.0;
  int64_t decay_steps = 0;  // the step cosine and linear reach min_lr (constant: unused)
};

// The optimizer and, for a schedule other than a constant one without warmup, its step-wise
// WarmupDecayLR. Throws std::invalid_argument naming a value that does not fit (a learning rate
// or a decay below 0, and WarmupDecayLR's own errors).
// Copies into `layer`, layer `index` of a model built per rank, the tensors of `weights` (global
// names, "3.attn.c_attn.weight"), checked as load_weights checks a model: every parameter and
// buffer there with its shape, nothing unknown, and every value finite. `source` names the file
// in messages.
void load_layer_weights(torch::nn::AnyModule& layer, int64_t index,
                        const std::map<std::string, at::Tensor>& weights,
                        const std::string& source);

OptimizerConfig adamw_with_recipe(const std::vector<at::Tensor>& parameters,
                                  const OptimizerRecipe& recipe);

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
  // Whether the data's targets may be kMaskedTarget (token files with loss masks): the loss is
  // then the mean over the targets not masked of each optimizer step's whole batch.
  void set_masked_targets(bool masked) { masked_targets_ = masked; }

 protected:
  LanguageModel(torch::nn::Sequential layers, const Config& config, OptimizerRecipe recipe)
      : Module(std::move(layers)), config_(config), recipe_(std::move(recipe)) {}
  // Built per rank (pipetrain/layer_spec.h).
  LanguageModel(std::vector<LayerSpec> layers, const Config& config, OptimizerRecipe recipe)
      : Module(std::move(layers)), config_(config), recipe_(std::move(recipe)) {}

  // The mean cross-entropy of predicting batch.target (the token after each position) from
  // batch.data (token ids [B, T]).
  virtual at::Tensor loss(const Batch& batch) = 0;
  // The mean cross-entropy of `logits` predicting `target`, written over the logits
  // (chunked_cross_entropy_). Without masks every position is a target: no ignore_index and no
  // masking pass. With them, sum_over() the targets not masked, so that every micro-batch, replica
  // and accumulated batch weighs its targets alike: a mean per micro-batch would weigh a
  // micro-batch of few unmasked targets as much as one of many.
  at::Tensor next_token_loss(const at::Tensor& logits, const at::Tensor& target) {
    if (!masked_targets_) return chunked_cross_entropy_(logits, target, std::nullopt);
    return sum_over(chunked_cross_entropy_sum_(logits, target, kMaskedTarget),
                    target.ne(kMaskedTarget).sum());
  }
  double lr() const { return recipe_.lr; }
  const OptimizerRecipe& recipe() const { return recipe_; }

 private:
  Config config_;
  OptimizerRecipe recipe_;
  bool masked_targets_ = false;
};

}  // namespace pipetrain::cli
