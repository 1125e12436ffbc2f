#include "pipetrain/data.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <stdexcept>

namespace pipetrain {

DataLoader::DataLoader(TensorDataset dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  if (options_.batch_size() < 1) {
    throw std::invalid_argument("batch size must be at least 1 (got " +
                                std::to_string(options_.batch_size()) + ")");
  }
  if (dataset_.inputs.size(0) != dataset_.targets.size(0)) {
    throw std::invalid_argument("the dataset has " + std::to_string(dataset_.inputs.size(0)) +
                                " inputs but " + std::to_string(dataset_.targets.size(0)) +
                                " targets");
  }
}

int64_t DataLoader::num_batches() const {
  const int64_t n = dataset_.size();
  const int64_t b = options_.batch_size();
  return options_.drop_last() ? n / b : (n + b - 1) / b;
}

Batch DataLoader::batch(int64_t epoch, int64_t index) const {
  if (options_.shuffle() && order_epoch_ != epoch) {
    auto generator =
        at::make_generator<at::CPUGeneratorImpl>(options_.seed() + static_cast<uint64_t>(epoch));
    order_ = torch::randperm(dataset_.size(), generator, torch::kInt64);
    order_epoch_ = epoch;
  }
  const int64_t begin = index * options_.batch_size();
  const int64_t end = std::min(begin + options_.batch_size(), dataset_.size());
  if (!options_.shuffle()) {
    return {dataset_.inputs.slice(0, begin, end), dataset_.targets.slice(0, begin, end)};
  }
  const auto rows = order_.slice(0, begin, end);
  return {dataset_.inputs.index_select(0, rows), dataset_.targets.index_select(0, rows)};
}

}  // namespace pipetrain
