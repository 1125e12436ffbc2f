// The batches one loop reads, prepared ahead of the step that uses them: DataLoaderOptions::
// num_workers threads read them from the dataset (two batches ahead per worker, as PyTorch's
// prefetch_factor), convert them to the run's precision and, on CUDA, into pinned memory; the
// copy to the GPU runs on a side stream while the previous step computes, and the step's stream
// waits for it on the GPU, not the host. A process that reads no field (a pipeline's middle
// stage) gets its row counts without any of this.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "pipetrain/data.h"

namespace pipetrain {

class BatchStream {
 public:
  // Batches [first, end) of `epoch` of `loader`, this process's `shard` of each.
  BatchStream(const DataLoader& loader, int64_t epoch, int64_t first, int64_t end,
              const BatchShard& shard, std::string precision, c10::Device device);
  // Stops the workers (a loop may end early) once their current read is done.
  ~BatchStream();
  BatchStream(const BatchStream&) = delete;
  BatchStream& operator=(const BatchStream&) = delete;

  // The next batch, in order, on the device; rethrows what reading it threw.
  Batch next();

 private:
  struct Prepared {
    Batch batch;
    std::exception_ptr error;
  };
  // A batch whose copy to the device is under way.
  struct Staged;

  Prepared prepare(int64_t index) const;
  void work();
  // Batch `index`, waiting for it unless `wait` is false (then nullopt when not ready).
  std::optional<Prepared> take(int64_t index, bool wait);
  std::unique_ptr<Staged> stage(Prepared prepared) const;

  const DataLoader& loader_;
  const int64_t epoch_, end_;
  const BatchShard shard_;
  const std::string precision_;
  const c10::Device device_;
  const bool reads_ = false;  // whether this process reads any field
  const int64_t lookahead_;
  // One side stream for all copies: the caching allocator keeps freed blocks per stream, so
  // a new stream from the pool each step would cost a cudaMalloc (and the GPU's queue) per step.
  std::optional<c10::Stream> copy_stream_;

  std::mutex mutex_;
  std::condition_variable prepared_, room_;
  std::map<int64_t, Prepared> ready_;
  int64_t next_to_prepare_;
  int64_t next_to_hand_;  // written by next() under mutex_
  bool stopping_ = false;
  std::vector<std::thread> workers_;
  std::unique_ptr<Staged> staged_;  // batch next_to_hand_, already on its way to the device
};

}  // namespace pipetrain
