// The data side of a Trainer. A Dataset hands out examples by index (yours, a TensorDataset, a
// LibTorch dataset through torch_dataset.h, or a token file through token_dataset.h); a
// DataLoader cuts its index range into batches, reshuffled each epoch from a seed, so that every
// rank sees the same order without talking to the others. Data-parallel replicas each read a
// disjoint shard of a global batch, and pipeline stages read only what they use (inputs on the
// first stage, targets and extra fields on the last), as Lightning's DistributedSampler and
// per-stage loaders do.
#pragma once

#include <ATen/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace pipetrain {

// Lightning's `batch`: `data` is the model's input, `target` the target, and `fields` any other
// per-sample tensors (a mask, sample weights, positions), every one batch-first with one row per
// sample. Pipelining cuts all of them into the same micro-batches.
struct Batch {
  Batch() = default;
  Batch(at::Tensor data, at::Tensor target, std::map<std::string, at::Tensor> fields = {})
      : data(std::move(data)), target(std::move(target)), fields(std::move(fields)) {}

  at::Tensor data;
  at::Tensor target;
  std::map<std::string, at::Tensor> fields;

  // Extra field `name`; throws std::out_of_range naming the fields there are.
  const at::Tensor& field(const std::string& name) const;
  // Rows [begin, end) of every tensor.
  Batch slice(int64_t begin, int64_t end) const;
  // Every tensor passed through `convert` (undefined ones stay undefined).
  template <typename Convert>
  Batch map(Convert convert) const {
    Batch out(data.defined() ? convert(data) : data, target.defined() ? convert(target) : target);
    for (const auto& [name, tensor] : fields) out.fields[name] = convert(tensor);
    return out;
  }
};

// One sample: the same fields as a Batch, without the batch dimension.
struct Example {
  at::Tensor data;
  at::Tensor target;
  std::map<std::string, at::Tensor> fields;
};

// Which fields a process reads: `data` on a pipeline's first stage, `target` (the target and
// every extra field) on its last, where the user's steps run.
struct FieldsWanted {
  bool data = true;
  bool target = true;
};

// What a Trainer trains on. Implement size() and get() (one example, stacked into batches by
// collate()), or get_batch() where reading many rows at once is cheaper. With num_workers > 1
// the loader calls get / get_batch from several threads at once (as LibTorch's and PyTorch's
// loaders do), so they must not change shared state unguarded.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Example `index`, in [0, size()).
  virtual Example get(int64_t index) const;
  // The examples `indices` (in that order) as one batch holding at least the fields `wanted`;
  // fields not wanted may be left undefined and are dropped. By default get() per index, then
  // collate().
  virtual Batch get_batch(const std::vector<int64_t>& indices, const FieldsWanted& wanted) const;
};

// Stacks `examples` (read at `indices`, for messages) into a batch of the fields `wanted`.
// Throws std::invalid_argument naming both indices and shapes when two examples' field differs
// in shape, or a field that some examples have and others lack.
Batch collate(const std::vector<Example>& examples, const std::vector<int64_t>& indices,
              const FieldsWanted& wanted);

// Rows of tensors held in memory: inputs, targets and extra fields with the same number of rows.
class TensorDataset : public Dataset {
 public:
  TensorDataset(at::Tensor inputs, at::Tensor targets,
                std::map<std::string, at::Tensor> fields = {});
  int64_t size() const override { return inputs.size(0); }
  Example get(int64_t index) const override;
  Batch get_batch(const std::vector<int64_t>& indices, const FieldsWanted& wanted) const override;

  at::Tensor inputs;   // [N, ...]
  at::Tensor targets;  // [N, ...]
  std::map<std::string, at::Tensor> fields;
};

struct DataLoaderOptions {
  TORCH_ARG(int64_t, batch_size) = 1;
  TORCH_ARG(bool, shuffle) = false;
  TORCH_ARG(bool, drop_last) = false;
  TORCH_ARG(uint64_t, seed) = 0;
  // Threads preparing batches ahead of the step (PyTorch's num_workers); 0 reads each batch when
  // the step asks for it.
  TORCH_ARG(int64_t, num_workers) = 1;
};

// Which part of every batch this process reads. With `replicas` data-parallel replicas a global
// batch has batch_size x replicas rows (batch_size is per replica, Lightning's convention) and
// replica r reads the r-th of `replicas` consecutive parts: so the rows of global batch k do not
// depend on the number of replicas. A process that does not read the inputs (or targets) gets a
// zero-width [rows, 0] tensor in their place, which still says how many rows the batch has.
struct BatchShard {
  int64_t replica = 0;
  int64_t replicas = 1;
  bool inputs = true;
  bool targets = true;
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options);
  DataLoader(TensorDataset dataset, DataLoaderOptions options);

  // Global batches per epoch that training runs. With replicas, a last global batch of fewer rows
  // than replicas is dropped: every replica must have a row to train on.
  int64_t num_batches(int64_t replicas = 1) const;
  // Global batches per epoch that validation, test and prediction run: every row once, so a last
  // global batch of fewer rows than replicas counts too (the replicas it leaves without a row
  // skip it). drop_last drops a short last batch here too.
  int64_t num_evaluation_batches(int64_t replicas = 1) const;
  // Rows per replica.
  int64_t batch_size() const { return options_.batch_size(); }
  // Examples in the dataset.
  int64_t dataset_size() const;
  const DataLoaderOptions& options() const { return options_; }
  // This shard of batch `index` of `epoch`; the order depends only on (seed, epoch). Calls the
  // dataset only for fields the shard reads, and not at all for a shard that reads none. Safe to
  // call from several threads. Throws std::runtime_error naming the examples when the dataset
  // fails or returns a batch of the wrong rows.
  Batch batch(int64_t epoch, int64_t index, const BatchShard& shard = {}) const;
  // The shard's rows times replicas over the global batch's rows: 1 when the global batch splits
  // evenly. Scaling each replica's mean loss by it makes the replicas' average gradient the
  // gradient of the global batch's mean loss.
  double share(int64_t index, const BatchShard& shard) const;

 private:
  // Rows [begin, end) of the epoch's order that this shard of batch `index` covers.
  std::pair<int64_t, int64_t> rows(int64_t index, const BatchShard& shard) const;
  // The dataset indices of rows [begin, end) of `epoch`'s order.
  std::vector<int64_t> indices(int64_t epoch, int64_t begin, int64_t end) const;

  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  // The shuffled order of the epoch last asked for, shared by the threads reading batches (and by
  // copies of this loader: it depends on nothing but the seed and the epoch).
  struct ShuffledOrder;
  std::shared_ptr<ShuffledOrder> order_;
};

}  // namespace pipetrain
