// Any LibTorch map-style dataset as a pipetrain Dataset, as it is: a
// torch::data::datasets::Dataset<Self, Example<>> (MNIST, your own), or one with transforms
// (`.map(Normalize<>(...))`, also `.map(Stack<>())`). pipetrain's DataLoader then does the
// sharding, stage-aware reading, seeded shuffling and drop_last that LibTorch's loaders cannot.
//
//   auto mnist = torch::data::datasets::MNIST(root).map(
//       torch::data::transforms::Normalize<>(0.1307, 0.3081));
//   pipetrain::DataLoader loader(pipetrain::from_torch_dataset(std::move(mnist)), options);
#pragma once

#include <torch/data/datasets/base.h>
#include <torch/data/example.h>

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "pipetrain/data.h"

namespace pipetrain {

template <typename TorchDataset>
class TorchDatasetAdapter : public Dataset {
 public:
  explicit TorchDatasetAdapter(TorchDataset dataset) : dataset_(std::move(dataset)) {
    if (!dataset_.size().has_value()) {
      throw std::invalid_argument(
          "this LibTorch dataset does not know its size (size() returned nullopt): pipetrain "
          "shards and shuffles by index, so it needs a map-style dataset with a size");
    }
  }

  int64_t size() const override { return static_cast<int64_t>(*dataset_.size()); }

  Batch get_batch(const std::vector<int64_t>& indices, const FieldsWanted& wanted) const override {
    const std::vector<size_t> request(indices.begin(), indices.end());
    // LibTorch's get_batch is not const (its datasets may cache); each call reads only.
    auto result = dataset_.get_batch(request);
    using Result = decltype(result);
    if constexpr (std::is_same_v<Result, torch::data::Example<>>) {
      // A batch transform (Stack<>) already stacked it.
      return Batch(std::move(result.data), std::move(result.target));
    } else {
      static_assert(std::is_same_v<Result, std::vector<torch::data::Example<>>>,
                    "pipetrain adapts LibTorch datasets of torch::data::Example<> (data and "
                    "target tensors)");
      std::vector<Example> examples;
      examples.reserve(result.size());
      for (auto& example : result) {
        examples.push_back({std::move(example.data), std::move(example.target), {}});
      }
      return collate(examples, indices, wanted);
    }
  }

 private:
  mutable TorchDataset dataset_;
};

// `dataset` (moved in) as a pipetrain Dataset.
template <typename TorchDataset>
std::shared_ptr<const Dataset> from_torch_dataset(TorchDataset dataset) {
  return std::make_shared<TorchDatasetAdapter<TorchDataset>>(std::move(dataset));
}

}  // namespace pipetrain
