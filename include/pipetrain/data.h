// The data side of a Trainer, kept small: an in-memory dataset of (input, target) rows and a
// loader that cuts it into batches, reshuffled each epoch from a seed so that every rank sees the
// same order without talking to the others. Data-parallel replicas each read a disjoint shard of
// a global batch, and pipeline stages read only what they use (inputs on the first stage, targets
// on the last), as Lightning's DistributedSampler and per-stage loaders do.
#pragma once

#include <torch/arg.h>
#include <torch/data/example.h>

#include <cstdint>

namespace pipetrain {

// Lightning's `batch`: `batch.data` is the input, `batch.target` the target.
using Batch = torch::data::Example<>;

struct TensorDataset {
  at::Tensor inputs;   // [N, ...]
  at::Tensor targets;  // [N, ...]
  int64_t size() const { return inputs.size(0); }
};

struct DataLoaderOptions {
  TORCH_ARG(int64_t, batch_size) = 1;
  TORCH_ARG(bool, shuffle) = false;
  TORCH_ARG(bool, drop_last) = false;
  TORCH_ARG(uint64_t, seed) = 0;
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
  DataLoader(TensorDataset dataset, DataLoaderOptions options);

  // Global batches per epoch. With replicas, a last global batch of fewer rows than replicas is
  // dropped: every replica must have a row to train on.
  int64_t num_batches(int64_t replicas = 1) const;
  // Rows per replica.
  int64_t batch_size() const { return options_.batch_size(); }
  // This shard of batch `index` of `epoch`; the order depends only on (seed, epoch).
  Batch batch(int64_t epoch, int64_t index, const BatchShard& shard = {}) const;
  // The shard's rows times replicas over the global batch's rows: 1 when the global batch splits
  // evenly. Scaling each replica's mean loss by it makes the replicas' average gradient the
  // gradient of the global batch's mean loss.
  double share(int64_t index, const BatchShard& shard) const;

 private:
  // Rows [begin, end) of the epoch's order that this shard of batch `index` covers.
  std::pair<int64_t, int64_t> rows(int64_t index, const BatchShard& shard) const;

  TensorDataset dataset_;
  DataLoaderOptions options_;
  mutable int64_t order_epoch_ = -1;
  mutable at::Tensor order_;
};

}  // namespace pipetrain
