#include "models/decoder_model.h"

#include <optional>

#include <pipetrain/cross_entropy.h>

namespace pipetrain::cli {

DecoderModel::DecoderModel(const nn::DecoderConfig& config, const OptimizerRecipe& recipe)
    : LanguageModel(nn::decoder(config), config, recipe) {}

at::Tensor DecoderModel::loss(const Batch& batch) {
  // Every position is a target, so no ignore_index (and no masking pass).
  return chunked_cross_entropy(forward(batch.data), batch.target, std::nullopt);
}

OptimizerConfig DecoderModel::configure_optimizers() {
  return adamw_with_recipe(parameters(), recipe());
}

}  // namespace pipetrain::cli
