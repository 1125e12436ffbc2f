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

int64_t DataLoader::num_batches(int64_t replicas) const {
  const int64_t n = dataset_.size();
  const int64_t b = options_.batch_size() * replicas;
  if (options_.drop_last() || n % b < replicas) return n / b;
  return n / b + 1;
}

std::pair<int64_t, int64_t> DataLoader::rows(int64_t index, const BatchShard& shard) const {
  const int64_t global = options_.batch_size() * shard.replicas;
  const int64_t begin = index * global;
  const int64_t rows = std::min(global, dataset_.size() - begin);
  // As tensor_split: the first rows % replicas replicas get one row more.
  const int64_t base = rows / shard.replicas, extra = rows % shard.replicas;
  const int64_t offset = shard.replica * base + std::min(shard.replica, extra);
  return {begin + offset, begin + offset + base + (shard.replica < extra ? 1 : 0)};
}

double DataLoader::share(int64_t index, const BatchShard& shard) const {
  const auto [begin, end] = rows(index, shard);
  const int64_t global_begin = index * options_.batch_size() * shard.replicas;
  const int64_t global_rows =
      std::min(options_.batch_size() * shard.replicas, dataset_.size() - global_begin);
  return static_cast<double>((end - begin) * shard.replicas) / static_cast<double>(global_rows);
}

Batch DataLoader::batch(int64_t epoch, int64_t index, const BatchShard& shard) const {
  if (options_.shuffle() && order_epoch_ != epoch) {
    auto generator =
        at::make_generator<at::CPUGeneratorImpl>(options_.seed() + static_cast<uint64_t>(epoch));
    order_ = torch::randperm(dataset_.size(), generator, torch::kInt64);
    order_epoch_ = epoch;
  }
  const auto [begin, end] = rows(index, shard);
  auto read = [&](const at::Tensor& column, bool wanted) {
    if (!wanted) return torch::empty({end - begin, 0}, column.options());
    if (!options_.shuffle()) return column.slice(0, begin, end);
    return column.index_select(0, order_.slice(0, begin, end));
  };
  return {read(dataset_.inputs, shard.inputs), read(dataset_.targets, shard.targets)};
}

}  // namespace pipetrain
