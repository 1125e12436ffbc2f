// Weights of a Hugging Face folder (--init-from) given to a model built per rank, one layer at a
// time: each process reads only its own layers' tensors.
#pragma once

#include <torch/nn/modules/container/any.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

namespace pipetrain::cli {

// Copies into `layer`, layer `index` of a model built per rank, the tensors of `weights` (global
// names, "3.attn.c_attn.weight"), checked as load_weights checks a model: every parameter and
// buffer there with its shape, nothing unknown, and every value finite. `source` names the file
// in messages.
void load_layer_weights(torch::nn::AnyModule& layer, int64_t index,
                        const std::map<std::string, at::Tensor>& weights,
                        const std::string& source);

}  // namespace pipetrain::cli
