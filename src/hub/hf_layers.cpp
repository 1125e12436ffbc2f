#include "hub/hf_layers.h"

#include <torch/torch.h>

#include <stdexcept>
#include <utility>

#include <pipetrain/checkpoint_io.h>

namespace pipetrain {

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

}  // namespace pipetrain
