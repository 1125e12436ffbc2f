#include "models/layer_weights.h"

#include <torch/torch.h>

#include <stdexcept>

#include <pipetrain/checkpoint_io.h>

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

}  // namespace pipetrain::cli
