// Optimizer state that survives a change of process layout. torch::optim::Optimizer::save() keys
// each parameter's state (Adam moments, SGD momentum, step counts) by its position in the
// optimizer's param_groups, and those positions change when a checkpoint saved by 2 stages x 2
// replicas resumes on one process holding the whole model, or on 2 stages with another balance.
// Here the state is keyed by the parameter's global name in the whole Sequential ("3.weight"),
// the same names model.safetensors uses, so any layout reads the state of exactly its parameters.
//
// Archive layout, at the top level of the archive passed in (nest it to share a file):
//   "kind"     str        the optimizer that wrote it: SGD | Adam | AdamW | RMSprop | Adagrad
//   "version"  int        1
//   "names"    list[str]  global names of the parameters that had state, in entry order
//   "state"    archive    entry i under key "<i>": torch's own XParamState::serialize() output
//                         for names[i], tensors on the CPU
// Names are values rather than keys so that no character in a name can clash with what torch's
// archives accept as a key.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pipetrain {

// (global name, parameter) pairs, e.g. a stage's slice of the Sequential's named_parameters()
// renamed to the whole model's layer indices.
using NamedParameters = std::vector<std::pair<std::string, at::Tensor>>;

// Writes the per-parameter state of every parameter in `parameters` that has state into
// `archive`, under its name; a parameter without state (never stepped, or not in the optimizer)
// is left out. Supports SGD, Adam, AdamW, RMSprop and Adagrad exactly (not subclasses); throws
// std::runtime_error naming any other optimizer, and std::invalid_argument for a repeated name.
void save_optimizer_state(const torch::optim::Optimizer& optimizer,
                          const NamedParameters& parameters,
                          torch::serialize::OutputArchive& archive);

// Restores the state of every parameter in `parameters` that the optimizer holds and `archive`
// has, moved to the parameter's device (and dtype, if floating point, as PyTorch's
// load_state_dict does); returns how many were restored. Meant for a freshly built optimizer:
// the others keep what they have, i.e. no state (Adagrad: its initial accumulator). Entries for
// names not in `parameters` (other stages' parameters) are ignored. Checks everything before
// changing anything, and throws std::runtime_error naming the optimizer for an unsupported one,
// for an archive written by another kind (Adam into SGD), and naming the parameter for a state
// whose shape differs from the parameter's or that lacks what this optimizer's options need
// (e.g. saved without amsgrad, loaded with it); std::invalid_argument for a repeated name.
int64_t load_optimizer_state(torch::optim::Optimizer& optimizer, const NamedParameters& parameters,
                             torch::serialize::InputArchive& archive);

}  // namespace pipetrain
