#include "models/language_model.h"

#include <torch/torch.h>

#include <stdexcept>

#include <pipetrain/checkpoint_io.h>
#include <pipetrain/fused_adamw.h>
#include <pipetrain/lr_scheduler.h>

namespace pipetrain::cli {

void load_layer_weights(torch::nn::AnyModule& layer, int64_t index,
                        const std::map<std::string, at::Tensor>& weights,
                        const std::string& source) {
  // In a Sequential of its own, as layer "0": load_weights' checks, by the layer's names.
  const std::string prefix = std::to_string(index) + ".";
  std::map<std::string, at::Tensor> own;
  for (const auto& [name, tensor] : weights) {
    // Else the first step's loss would be NaN, and the learning rate blamed.
    if (!torch::isfinite(tensor).all().item<bool>()) {
      throw std::invalid_argument(source + ": tensor \"" + name +
                                  "\" holds NaN or infinite values: the weights are damaged, or "
                                  "were saved from a run that diverged; use another copy");
    }
    own["0." + name.substr(prefix.size())] = tensor;
  }
  torch::nn::Sequential holder;
  holder->push_back(layer);
  load_weights(holder, own, source);
}

OptimizerConfig adamw_with_recipe(const std::vector<at::Tensor>& parameters,
                                  const OptimizerRecipe& recipe) {
  if (!(recipe.lr >= 0)) {
    throw std::invalid_argument("--lr " + std::to_string(recipe.lr) + " must be 0 or more");
  }
  if (recipe.weight_decay < 0) {
    throw std::invalid_argument("--weight-decay " + std::to_string(recipe.weight_decay) +
                                " must be 0 or more");
  }
  std::vector<at::Tensor> decayed, kept;
  for (const auto& parameter : parameters)
    (parameter.dim() >= 2 ? decayed : kept).push_back(parameter);
  const auto options = torch::optim::AdamWOptions(recipe.lr).betas({0.9, 0.95}).eps(1e-8);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decayed,
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(options).weight_decay(recipe.weight_decay)));
  groups.emplace_back(kept, std::make_unique<torch::optim::AdamWOptions>(
                                torch::optim::AdamWOptions(options).weight_decay(0)));
  OptimizerConfig config = std::make_unique<FusedAdamW>(std::move(groups), options);
  if (recipe.lr_schedule != "constant" || recipe.warmup_steps > 0) {
    config.lr_scheduler =
        std::make_unique<WarmupDecayLR>(*config.optimizer, recipe.lr_schedule, recipe.warmup_steps,
                                        recipe.decay_steps, recipe.min_lr);
    config.interval = "step";
  }
  return config;
}

}  // namespace pipetrain::cli
