#include "stage_value.h"

#include <c10/util/Exception.h>
#include <c10/util/Type.h>

#include <stdexcept>
#include <tuple>
#include <utility>

#include "pipetrain/error.h"

namespace pipetrain {
namespace {

using torch::nn::AnyValue;
using Tensor = at::Tensor;
using Tuple2 = std::tuple<Tensor, Tensor>;
using Tuple3 = std::tuple<Tensor, Tensor, Tensor>;
using Tuple4 = std::tuple<Tensor, Tensor, Tensor, Tensor>;

template <typename Tuple>
std::vector<Tensor> tuple_tensors(const Tuple& tuple) {
  return std::apply([](const auto&... t) { return std::vector<Tensor>{t...}; }, tuple);
}

}  // namespace

StageValue StageValue::unpack(AnyValue value, int64_t layer) {
  if (const auto* t = value.try_get<Tensor>()) return of(*t);
  if (const auto* v = value.try_get<std::vector<Tensor>>()) return {Packing::kVector, *v};
  if (const auto* t = value.try_get<Tuple2>()) return {Packing::kTuple, tuple_tensors(*t)};
  if (const auto* t = value.try_get<Tuple3>()) return {Packing::kTuple, tuple_tensors(*t)};
  if (const auto* t = value.try_get<Tuple4>()) return {Packing::kTuple, tuple_tensors(*t)};
  throw std::invalid_argument(
      "layer " + std::to_string(layer) + " returns a " + c10::demangle(value.type_info().name()) +
      ", which cannot cross a stage boundary: return at::Tensor, std::vector<at::Tensor> or a "
      "std::tuple of 2 to 4 at::Tensor (or keep the layer and the one after it on one stage with "
      "PipeOptions::balance, --balance)");
}

StageValue StageValue::from_label(int64_t label, std::vector<Tensor> tensors) {
  const auto packing = static_cast<Packing>(label);
  const bool fits = (packing == Packing::kTensor && tensors.size() == 1) ||
                    packing == Packing::kVector ||
                    (packing == Packing::kTuple && tensors.size() >= 2 && tensors.size() <= 4);
  if (!fits) {
    throw std::runtime_error("the previous stage sent " + std::to_string(tensors.size()) +
                             " tensors labelled " + std::to_string(label) +
                             ", which no layer returns: are all ranks running the same pipetrain?");
  }
  return {packing, std::move(tensors)};
}

AnyValue StageValue::pack() const {
  switch (packing) {
    case Packing::kTensor:
      return AnyValue(tensors[0]);
    case Packing::kVector:
      return AnyValue(tensors);
    case Packing::kTuple:
      if (tensors.size() == 2) return AnyValue(Tuple2(tensors[0], tensors[1]));
      if (tensors.size() == 3) return AnyValue(Tuple3(tensors[0], tensors[1], tensors[2]));
      return AnyValue(Tuple4(tensors[0], tensors[1], tensors[2], tensors[3]));
  }
  TORCH_INTERNAL_ASSERT(false, "unknown packing");
}

std::string StageValue::describe() const {
  if (is_tensor()) return shape_text(tensors[0].sizes());
  std::string text = packing == Packing::kVector ? "a std::vector of " : "a std::tuple of ";
  for (size_t i = 0; i < tensors.size(); ++i) {
    text += (i ? ", " : "") + shape_text(tensors[i].sizes());
  }
  return text;
}

}  // namespace pipetrain
