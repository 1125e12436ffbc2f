// The data side of a Trainer, kept small: an in-memory dataset of (input, target) rows and a
// loader that cuts it into batches, reshuffled each epoch from a seed so that every rank of a
// pipeline sees the same batches without talking to the others.
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

class DataLoader {
 public:
  DataLoader(TensorDataset dataset, DataLoaderOptions options);

  int64_t num_batches() const;
  int64_t batch_size() const { return options_.batch_size(); }
  // Batch `index` of `epoch`; the order depends only on (seed, epoch).
  Batch batch(int64_t epoch, int64_t index) const;

 private:
  TensorDataset dataset_;
  DataLoaderOptions options_;
  mutable int64_t order_epoch_ = -1;
  mutable at::Tensor order_;
};

}  // namespace pipetrain
