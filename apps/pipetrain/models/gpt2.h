// GPT-2 as a built-in model (`--model gpt2`): pipetrain::nn's gpt2_layers() trained on next-token
// prediction, built per rank: each process builds (and, from a Hugging Face folder, reads) only the
// layers of its stages.
#pragma once

#include <torch/torch.h>

#include <string>

#include <pipetrain/callback.h>
#include <pipetrain/module.h>
#include <pipetrain/nn/gpt2.h>

#include "models/language_model.h"

namespace pipetrain::cli {

// Next-token prediction: mean cross-entropy over every position; adamw_with_recipe.
class Gpt2Model : public LanguageModel<nn::Gpt2Config> {
 public:
  explicit Gpt2Model(const nn::Gpt2Config& config, double lr = 6e-4);
  // Built per rank (each process builds, and reads from `init_from`, a Hugging Face GPT-2 folder,
  // only its stages' layers), each layer drawn as nn::gpt2 draws it, from its own seed.
  Gpt2Model(const nn::Gpt2Config& config, const OptimizerRecipe& recipe,
            const std::string& init_from = "");

  OptimizerConfig configure_optimizers() override;

 private:
  at::Tensor loss(const Batch& batch) override;
};

// Logs val_ppl, the validation perplexity exp(val_loss), beside val_loss after every validation of
// a fit: the exponential of the epoch's mean loss (a mean of per-batch exponentials would not be
// a perplexity), so it cannot be a value the steps log.
class PerplexityLogger : public Callback {
 public:
  void on_validation_end(Trainer& trainer, Module& module) override;
};

}  // namespace pipetrain::cli
