#include "pipetrain/language_model.h"

#include <torch/optim/adamw.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <utility>

#include "pipetrain/cross_entropy.h"
#include "pipetrain/fused_adamw.h"
#include "pipetrain/loss_mask.h"
#include "pipetrain/lr_scheduler.h"

namespace pipetrain {

LanguageModel::LanguageModel(torch::nn::Sequential layers, LanguageModelOptions options)
    : Module(std::move(layers)), options(std::move(options)) {}

LanguageModel::LanguageModel(std::vector<LayerSpec> layers, LanguageModelOptions options)
    : Module(std::move(layers)), options(std::move(options)) {}

at::Tensor LanguageModel::training_step(const Batch& batch, int64_t) {
  auto value = loss(batch);
  log("train_loss", value, LogOptions().prog_bar(true));
  return value;
}

void LanguageModel::validation_step(const Batch& batch, int64_t) {
  log("val_loss", loss(batch), LogOptions().prog_bar(true));
}

void LanguageModel::test_step(const Batch& batch, int64_t) { log("test_loss", loss(batch)); }

at::Tensor LanguageModel::loss(const Batch& batch) {
  // In place: the logits' gradient goes over them, as nothing reads them after the loss.
  const auto logits = forward(batch.data);
  if (!options.masked_targets()) {
    // Every position a target: no ignore_index, so no masking pass.
    return chunked_cross_entropy_(logits, batch.target, std::nullopt);
  }
  // Summed over the targets not masked and divided by those of the whole optimizer step (every
  // micro-batch, replica and accumulated batch): a mean per micro-batch would weigh a micro-batch
  // of few unmasked targets as much as one of many.
  return sum_over(chunked_cross_entropy_sum_(logits, batch.target, kMaskedTarget),
                  batch.target.ne(kMaskedTarget).sum());
}

OptimizerConfig LanguageModel::configure_optimizers() {
  const LanguageModelOptions& o = options;
  if (!(o.lr() >= 0)) {
    throw std::invalid_argument("LanguageModel lr (--lr) " + std::to_string(o.lr()) +
                                " must be 0 or more");
  }
  if (!(o.weight_decay() >= 0)) {
    throw std::invalid_argument("LanguageModel weight_decay (--weight-decay) " +
                                std::to_string(o.weight_decay()) + " must be 0 or more");
  }
  std::vector<at::Tensor> decayed, kept;
  for (const auto& parameter : parameters())
    (parameter.dim() >= 2 ? decayed : kept).push_back(parameter);
  const auto adamw = torch::optim::AdamWOptions(o.lr()).betas(o.betas()).eps(o.eps());
  // Both groups always, even where a stage holds no matrix or no gain: the LearningRateMonitor's
  // column names (lr-AdamW/pg1, /pg2) then do not depend on the layout.
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decayed,
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(adamw).weight_decay(o.weight_decay())));
  groups.emplace_back(kept, std::make_unique<torch::optim::AdamWOptions>(
                                torch::optim::AdamWOptions(adamw).weight_decay(0)));
  OptimizerConfig config = std::make_unique<FusedAdamW>(std::move(groups), adamw);
  if (o.lr_schedule() != "constant" || o.warmup_steps() > 0) {
    config.lr_scheduler = std::make_unique<WarmupDecayLR>(
        *config.optimizer, o.lr_schedule(), o.warmup_steps(), o.decay_steps(), o.min_lr());
    config.interval = "step";
  }
  return config;
}

}  // namespace pipetrain
