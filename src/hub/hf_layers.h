// A model built per rank from a Hugging Face folder: each process reads the tensors of its own
// layers alone.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/any.h>

#include <cstdint>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <pipetrain/layer_spec.h>

namespace pipetrain {

// Copies into `layer`, layer `index` of a model built per rank, the tensors of `weights` (global
// names, "3.attn.c_attn.weight"), checked as load_weights checks a model: every parameter and
// buffer there with its shape, nothing unknown, and every value finite. `source` names the file
// in messages.
void load_layer_weights(torch::nn::AnyModule& layer, int64_t index,
                        const std::map<std::string, at::Tensor>& weights,
                        const std::string& source);

// A folder's tensors under pipetrain's names ("3.attn.c_attn.weight"), those `wanted` accepts.
using LayerWeightsReader = std::function<std::map<std::string, at::Tensor>(
    const std::function<bool(const std::string& name)>& wanted)>;

// `layers`, each built as before and then given its own tensors from `read` (checked as
// load_layer_weights checks them; `source` names the folder in messages). A tied layer takes its
// values through its tie.
std::vector<LayerSpec> layers_read_from(std::vector<LayerSpec> layers, const std::string& source,
                                        const LayerWeightsReader& read);

}  // namespace pipetrain
