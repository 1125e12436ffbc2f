// What a stage takes and returns: the tensors its layer passed on, and the C++ type the layer
// passed them as, so the next stage's first layer gets the type it takes. A layer may take and
// return one at::Tensor, a std::vector<at::Tensor>, or a std::tuple of two to four at::Tensor
// (torchgpipe's tuples): several tensors cross a stage boundary together, a mask or a skip
// connection riding along with the activations.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/any_value.h>

#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain {

struct StageValue {
  // How the tensors were passed: the label a Packet carries them with (p2p.h).
  enum class Packing : int64_t { kTensor = 0, kVector = 1, kTuple = 2 };

  Packing packing = Packing::kTensor;
  std::vector<at::Tensor> tensors;

  static StageValue of(at::Tensor tensor) { return {Packing::kTensor, {std::move(tensor)}}; }
  // The tensors of a layer's result; throws std::invalid_argument naming the type when it is
  // none of the types above (`layer`: the layer's index in the Sequential, for the message).
  static StageValue unpack(torch::nn::AnyValue value, int64_t layer);
  // A packet's tensors, as a packing its label names.
  static StageValue from_label(int64_t label, std::vector<at::Tensor> tensors);

  // The value to give a layer.
  torch::nn::AnyValue pack() const;
  bool is_tensor() const { return packing == Packing::kTensor; }
  // "[4, 16]" for one tensor, "a std::tuple of [4, 16], [4]" for several (error messages).
  std::string describe() const;
};

}  // namespace pipetrain
