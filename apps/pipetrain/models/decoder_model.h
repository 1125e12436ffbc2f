// Llama 3 and Qwen3 as built-in models (`--model llama`, `--model qwen3`): pipetrain::nn's
// decoder() trained on next-token prediction.
#pragma once

#include <torch/torch.h>

#include <string>

#include <pipetrain/module.h>
#include <pipetrain/nn/decoder.h>

#include "models/language_model.h"

namespace pipetrain::cli {

// Mean cross-entropy over every position (chunked: never holds fp32 logits); adamw_with_recipe.
class DecoderModel : public LanguageModel<nn::DecoderConfig> {
 public:
  DecoderModel(const nn::DecoderConfig& config, const OptimizerRecipe& recipe);

  OptimizerConfig configure_optimizers() override;

 private:
  at::Tensor loss(const Batch& batch) override;
};

}  // namespace pipetrain::cli
