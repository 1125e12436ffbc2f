#include "models/hf_layers.h"

#include <utility>

#include "models/language_model.h"

namespace pipetrain::cli {

std::vector<LayerSpec> layers_read_from(std::vector<LayerSpec> layers, const std::string& source,
                                        const LayerWeightsReader& read) {
  for (size_t i = 0; i < layers.size(); ++i) {
    if (!layers[i].tied_to.empty()) continue;
    const std::string prefix = std::to_string(i) + ".";
    layers[i].build = [source, read, prefix, i, build = std::move(layers[i].build)] {
      auto layer = build();
      load_layer_weights(layer, static_cast<int64_t>(i),
                         read([&](const std::string& name) { return name.rfind(prefix, 0) == 0; }),
                         source);
      return layer;
    };
  }
  return layers;
}

}  // namespace pipetrain::cli
