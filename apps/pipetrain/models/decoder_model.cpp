#include "models/decoder_model.h"

#include <optional>
#include <utility>

#include <pipetrain/checkpoint_io.h>

#include "models/hf_decoder.h"

namespace pipetrain::cli {
namespace {

// Each layer as decoder_layers() builds it, then, from `init_from`, given that layer's tensors
// alone (a tied head takes the embedding's values through its tie).
std::vector<LayerSpec> layers_read_from(const nn::DecoderConfig& config,
                                        const std::string& init_from) {
  auto layers = nn::decoder_layers(config);
  if (init_from.empty()) return layers;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (!layers[i].tied_to.empty()) continue;
    const std::string prefix = std::to_string(i) + ".";
    layers[i].build = [config, init_from, prefix, i, build = std::move(layers[i].build)] {
      auto layer = build();
      load_layer_weights(layer, static_cast<int64_t>(i),
                         read_hf_decoder_weights(
                             init_from, config,
                             [&](const std::string& name) { return name.rfind(prefix, 0) == 0; }),
                         init_from);
      return layer;
    };
  }
  return layers;
}

}  // namespace

DecoderModel::DecoderModel(const nn::DecoderConfig& config, const OptimizerRecipe& recipe,
                           const std::string& init_from)
    : LanguageModel(layers_read_from(config, init_from), config, recipe) {}

at::Tensor DecoderModel::loss(const Batch& batch) {
  // The logits' gradient goes over them (nothing reads them after the loss).
  return next_token_loss(forward(batch.data), batch.target);
}

OptimizerConfig DecoderModel::configure_optimizers() {
  return adamw_with_recipe(parameters(), recipe());
}

}  // namespace pipetrain::cli
