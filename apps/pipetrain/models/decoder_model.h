// Llama 3 and Qwen3 as built-in models (`--model llama`, `--model qwen3`): pipetrain::nn's
// decoder_layers() trained on next-token prediction, built per rank: each process builds (and,
// from a Hugging Face folder, reads) only the layers of its stages.
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
  // `init_from`: a Hugging Face folder each layer's weights are read from, or "".
  DecoderModel(const nn::DecoderConfig& config, const OptimizerRecipe& recipe,
               const std::string& init_from);

  OptimizerConfig configure_optimizers() override;

 private:
  at::Tensor loss(const Batch& batch) override;
};

}  // namespace pipetrain::cli
