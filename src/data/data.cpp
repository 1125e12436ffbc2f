#include "pipetrain/data.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <mutex>
#include <stdexcept>

namespace pipetrain {
namespace {

// Stacks field `name` of every example; `pick` reads it from one example.
template <typename Pick>
at::Tensor stack_field(const std::vector<Example>& examples, const std::vector<int64_t>& indices,
                       const std::string& name, Pick pick) {
  std::vector<at::Tensor> rows;
  rows.reserve(examples.size());
  for (size_t i = 0; i < examples.size(); ++i) {
    const at::Tensor* tensor = pick(examples[i]);
    if (tensor == nullptr || !tensor->defined()) {
      throw std::invalid_argument(
          "example " + std::to_string(indices[i]) + " of the dataset has no " + name +
          (i == 0 ? "" : ", but example " + std::to_string(indices[0]) + " has one"));
    }
    if (!rows.empty() && rows[0].sizes() != tensor->sizes()) {
      throw std::invalid_argument("examples " + std::to_string(indices[0]) + " and " +
                                  std::to_string(indices[i]) + " of the dataset have " + name +
                                  " of different shapes, " + c10::str(rows[0].sizes()) + " and " +
                                  c10::str(tensor->sizes()) + ": make every example's " + name +
                                  " the same shape (pad it), or implement get_batch");
    }
    rows.push_back(*tensor);
  }
  return torch::stack(rows);
}

}  // namespace

const at::Tensor& Batch::field(const std::string& name) const {
  const auto found = fields.find(name);
  if (found != fields.end()) return found->second;
  std::string names;
  for (const auto& [known, tensor] : fields) names += (names.empty() ? "" : ", ") + known;
  throw std::out_of_range("the batch has no field '" + name + "' (its fields: " +
                          (names.empty() ? "none beside data and target" : names) + ")");
}

Batch Batch::slice(int64_t begin, int64_t end) const {
  return map([&](const at::Tensor& tensor) { return tensor.slice(0, begin, end); });
}

Example Dataset::get(int64_t /*index*/) const {
  throw std::logic_error(
      "this Dataset implements neither get(index) nor get_batch(indices, wanted): implement one");
}

Batch Dataset::get_batch(const std::vector<int64_t>& indices, const FieldsWanted& wanted) const {
  std::vector<Example> examples;
  examples.reserve(indices.size());
  for (const int64_t index : indices) {
    try {
      examples.push_back(get(index));
    } catch (const std::exception& e) {
      throw std::runtime_error("reading example " + std::to_string(index) +
                               " of the dataset failed: " + e.what());
    }
  }
  return collate(examples, indices, wanted);
}

Batch collate(const std::vector<Example>& examples, const std::vector<int64_t>& indices,
              const FieldsWanted& wanted) {
  if (examples.empty()) return {};
  Batch batch;
  if (wanted.data) {
    batch.data = stack_field(examples, indices, "data",
                             [](const Example& example) { return &example.data; });
  }
  if (!wanted.target) return batch;
  // The batch has the first example's target and fields: one only later examples have would be
  // dropped from it.
  for (size_t i = 1; i < examples.size(); ++i) {
    const auto refuse = [&](const std::string& what) {
      throw std::invalid_argument("example " + std::to_string(indices[i]) + " of the dataset has " +
                                  what + ", but example " + std::to_string(indices[0]) +
                                  " has none: give every example the same fields");
    };
    if (examples[i].target.defined() && !examples[0].target.defined()) refuse("a target");
    for (const auto& [name, tensor] : examples[i].fields) {
      if (examples[0].fields.count(name) == 0) refuse("field '" + name + "'");
    }
  }
  if (examples[0].target.defined()) {
    batch.target = stack_field(examples, indices, "a target",
                               [](const Example& example) { return &example.target; });
  }
  for (const auto& [name, first] : examples[0].fields) {
    batch.fields[name] =
        stack_field(examples, indices, "field '" + name + "'", [&](const Example& example) {
          const auto found = example.fields.find(name);
          return found == example.fields.end() ? nullptr : &found->second;
        });
  }
  return batch;
}

TensorDataset::TensorDataset(at::Tensor inputs, at::Tensor targets,
                             std::map<std::string, at::Tensor> fields)
    : inputs(std::move(inputs)), targets(std::move(targets)), fields(std::move(fields)) {
  if (!this->inputs.defined() || this->inputs.dim() == 0) {
    throw std::invalid_argument("a TensorDataset's inputs must be a tensor of [rows, ...]");
  }
  auto check_rows = [&](const at::Tensor& tensor, const std::string& name) {
    if (!tensor.defined() || tensor.dim() == 0 || tensor.size(0) != this->inputs.size(0)) {
      throw std::invalid_argument(
          "the dataset has " + std::to_string(this->inputs.size(0)) + " inputs but " +
          (tensor.defined() && tensor.dim() > 0 ? std::to_string(tensor.size(0)) : "no") + " " +
          name + " rows: give every field one row per input");
    }
  };
  check_rows(this->targets, "targets");
  for (const auto& [name, tensor] : this->fields) check_rows(tensor, "'" + name + "'");
}

Example TensorDataset::get(int64_t index) const {
  Example example{inputs[index], targets[index], {}};
  for (const auto& [name, tensor] : fields) example.fields[name] = tensor[index];
  return example;
}

Batch TensorDataset::get_batch(const std::vector<int64_t>& indices,
                               const FieldsWanted& wanted) const {
  // Columns may live on a GPU already: the indices follow them there, once per device.
  const auto rows = torch::tensor(indices, torch::kInt64).to(inputs.device());
  auto read = [&](const at::Tensor& column) {
    return column.index_select(0,
                               column.device() == rows.device() ? rows : rows.to(column.device()));
  };
  Batch batch;
  if (wanted.data) batch.data = read(inputs);
  if (!wanted.target) return batch;
  batch.target = read(targets);
  for (const auto& [name, tensor] : fields) batch.fields[name] = read(tensor);
  return batch;
}

struct DataLoader::ShuffledOrder {
  std::mutex mutex;
  int64_t epoch = -1;
  std::shared_ptr<const std::vector<int64_t>> order;
};

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(options), order_(std::make_shared<ShuffledOrder>()) {
  if (!dataset_) throw std::invalid_argument("DataLoader: the dataset is null");
  if (options_.batch_size() < 1) {
    throw std::invalid_argument("batch size must be at least 1 (got " +
                                std::to_string(options_.batch_size()) + ")");
  }
  if (options_.num_workers() < 0) {
    throw std::invalid_argument("num_workers must be 0 or more (got " +
                                std::to_string(options_.num_workers()) + ")");
  }
}

DataLoader::DataLoader(TensorDataset dataset, DataLoaderOptions options)
    : DataLoader(std::make_shared<TensorDataset>(std::move(dataset)), options) {}

int64_t DataLoader::dataset_size() const { return dataset_->size(); }

int64_t DataLoader::num_batches(int64_t replicas) const {
  const int64_t n = dataset_->size();
  const int64_t b = options_.batch_size() * replicas;
  if (options_.drop_last() || n % b < replicas) return n / b;
  return n / b + 1;
}

int64_t DataLoader::num_evaluation_batches(int64_t replicas) const {
  const int64_t n = dataset_->size();
  const int64_t b = options_.batch_size() * replicas;
  return n / b + (options_.drop_last() || n % b == 0 ? 0 : 1);
}

std::pair<int64_t, int64_t> DataLoader::rows(int64_t index, const BatchShard& shard) const {
  const int64_t global = options_.batch_size() * shard.replicas;
  const int64_t begin = index * global;
  const int64_t rows = std::min(global, dataset_->size() - begin);
  // As tensor_split: the first rows % replicas replicas get one row more.
  const int64_t base = rows / shard.replicas, extra = rows % shard.replicas;
  const int64_t offset = shard.replica * base + std::min(shard.replica, extra);
  return {begin + offset, begin + offset + base + (shard.replica < extra ? 1 : 0)};
}

double DataLoader::share(int64_t index, const BatchShard& shard) const {
  const auto [begin, end] = rows(index, shard);
  const int64_t global_begin = index * options_.batch_size() * shard.replicas;
  const int64_t global_rows =
      std::min(options_.batch_size() * shard.replicas, dataset_->size() - global_begin);
  return static_cast<double>((end - begin) * shard.replicas) / static_cast<double>(global_rows);
}

std::vector<int64_t> DataLoader::indices(int64_t epoch, int64_t begin, int64_t end) const {
  std::vector<int64_t> picked;
  picked.reserve(static_cast<size_t>(end - begin));
  if (!options_.shuffle()) {
    for (int64_t row = begin; row < end; ++row) picked.push_back(row);
    return picked;
  }
  std::shared_ptr<const std::vector<int64_t>> order;
  {
    std::lock_guard<std::mutex> lock(order_->mutex);
    if (order_->epoch != epoch) {
      auto generator =
          at::make_generator<at::CPUGeneratorImpl>(options_.seed() + static_cast<uint64_t>(epoch));
      const auto permutation = torch::randperm(dataset_->size(), generator, torch::kInt64);
      const int64_t* values = permutation.data_ptr<int64_t>();
      order_->order =
          std::make_shared<const std::vector<int64_t>>(values, values + permutation.numel());
      order_->epoch = epoch;
    }
    order = order_->order;
  }
  picked.assign(order->begin() + begin, order->begin() + end);
  return picked;
}

Batch DataLoader::batch(int64_t epoch, int64_t index, const BatchShard& shard) const {
  const auto [begin, end] = rows(index, shard);
  const int64_t count = end - begin;
  const FieldsWanted wanted{shard.inputs, shard.targets};
  Batch batch;
  // A replica left without a row of an evaluation's short last batch reads nothing.
  if (count > 0 && (wanted.data || wanted.target)) {
    const std::vector<int64_t> picked = indices(epoch, begin, end);
    // For the messages alone: built only when one is thrown.
    const auto which = [&] {
      return count == 0 ? std::string("no examples")
                        : "examples " + std::to_string(picked.front()) + ", ... (" +
                              std::to_string(count) + " in all)";
    };
    try {
      batch = dataset_->get_batch(picked, wanted);
    } catch (const std::exception& e) {
      throw std::runtime_error("the dataset failed to read batch " + std::to_string(index) +
                               " of epoch " + std::to_string(epoch) + " (" + which() +
                               "): " + e.what());
    }
    auto check = [&](const at::Tensor& tensor, const std::string& name) {
      if (!tensor.defined() || tensor.dim() == 0 || tensor.size(0) != count) {
        throw std::runtime_error(
            "the dataset's get_batch returned " +
            (tensor.defined() ? "a " + name + " of shape " + c10::str(tensor.sizes())
                              : "no " + name) +
            " for batch " + std::to_string(index) + " (" + which() + "), which needs " +
            std::to_string(count) + " rows: return one row per index asked for");
      }
    };
    if (wanted.data) check(batch.data, "data");
    if (wanted.target) {
      if (batch.target.defined()) check(batch.target, "target");
      for (const auto& [name, tensor] : batch.fields) check(tensor, "field '" + name + "'");
    }
  }
  // What this process does not read stays a zero-width stand-in that says how many rows it has.
  const auto stand_in = torch::empty({count, 0});
  if (!wanted.data) batch.data = stand_in;
  if (!wanted.target) {
    batch.target = stand_in;
    batch.fields.clear();
  } else if (!batch.target.defined()) {
    batch.target = stand_in;
  }
  return batch;
}

}  // namespace pipetrain
