#include "batch_stream.h"

#ifdef PIPETRAIN_HAS_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#endif
#include <torch/torch.h>

#include <utility>

#include "precision.h"

namespace pipetrain {

struct BatchStream::Staged {
  Batch batch;
  std::exception_ptr error;
#ifdef PIPETRAIN_HAS_CUDA
  std::unique_ptr<at::cuda::CUDAEvent> copied;  // recorded on the side stream after the copy
#endif
};

BatchStream::BatchStream(const DataLoader& loader, int64_t epoch, int64_t first, int64_t end,
                         const BatchShard& shard, std::string precision, c10::Device device)
    : loader_(loader),
      epoch_(epoch),
      end_(end),
      shard_(shard),
      precision_(std::move(precision)),
      device_(device),
      reads_(shard.inputs || shard.targets),
      lookahead_(2 * loader.options().num_workers()),
      next_to_prepare_(first),
      next_to_hand_(first) {
  if (!reads_) return;
#ifdef PIPETRAIN_HAS_CUDA
  if (device_.is_cuda()) {
    copy_stream_ = at::cuda::getStreamFromPool(/*isHighPriority=*/false, device_.index());
  }
#endif
  const int64_t workers = std::min<int64_t>(loader.options().num_workers(), end - first);
  for (int64_t i = 0; i < workers; ++i) workers_.emplace_back([this] { work(); });
}

BatchStream::~BatchStream() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  room_.notify_all();
  for (auto& worker : workers_) worker.join();
}

BatchStream::Prepared BatchStream::prepare(int64_t index) const {
  Prepared prepared;
  try {
    prepared.batch = convert_batch(loader_.batch(epoch_, index, shard_), precision_);
    // Pinned host memory lets the copy to the GPU run asynchronously.
    if (device_.is_cuda() && reads_) {
      prepared.batch =
          prepared.batch.map([](const at::Tensor& t) { return t.is_cuda() ? t : t.pin_memory(); });
    }
  } catch (...) {
    prepared.error = std::current_exception();
  }
  return prepared;
}

void BatchStream::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    room_.wait(lock, [&] {
      return stopping_ || next_to_prepare_ >= end_ || next_to_prepare_ < next_to_hand_ + lookahead_;
    });
    if (stopping_ || next_to_prepare_ >= end_) return;
    const int64_t index = next_to_prepare_++;
    lock.unlock();
    Prepared prepared = prepare(index);
    lock.lock();
    ready_[index] = std::move(prepared);
    prepared_.notify_all();
  }
}

std::optional<BatchStream::Prepared> BatchStream::take(int64_t index, bool wait) {
  if (workers_.empty()) {
    if (!wait) return std::nullopt;
    return prepare(index);
  }
  std::unique_lock<std::mutex> lock(mutex_);
  if (wait) {
    prepared_.wait(lock, [&] { return ready_.count(index) > 0; });
  } else if (ready_.count(index) == 0) {
    return std::nullopt;
  }
  Prepared prepared = std::move(ready_.at(index));
  ready_.erase(index);
  lock.unlock();
  room_.notify_all();
  return prepared;
}

std::unique_ptr<BatchStream::Staged> BatchStream::stage(Prepared prepared) const {
  auto staged = std::make_unique<Staged>();
  staged->error = prepared.error;
  // A process that reads nothing holds zero-width stand-ins: nothing to copy.
  if (prepared.error || !device_.is_cuda() || !reads_) {
    staged->batch = std::move(prepared.batch);
    return staged;
  }
#ifdef PIPETRAIN_HAS_CUDA
  const at::cuda::CUDAStream side(at::cuda::CUDAStream::UNCHECKED, *copy_stream_);
  const at::cuda::CUDAStreamGuard guard(side);
  staged->batch =
      prepared.batch.map([&](const at::Tensor& t) { return t.to(device_, /*non_blocking=*/true); });
  staged->copied = std::make_unique<at::cuda::CUDAEvent>();
  staged->copied->record(side);
#endif
  return staged;
}

Batch BatchStream::next() {
  std::unique_ptr<Staged> current = std::move(staged_);
  if (!current) current = stage(*take(next_to_hand_, /*wait=*/true));
  {
    // The workers read it to know how far ahead they may read.
    std::lock_guard<std::mutex> lock(mutex_);
    ++next_to_hand_;
  }
  room_.notify_all();
  // The next batch starts its way to the device now, while this one's step computes.
  if (next_to_hand_ < end_) {
    if (auto prepared = take(next_to_hand_, /*wait=*/false)) staged_ = stage(std::move(*prepared));
  }
  if (current->error) std::rethrow_exception(current->error);
#ifdef PIPETRAIN_HAS_CUDA
  if (current->copied) {
    const auto step_stream = at::cuda::getCurrentCUDAStream(device_.index());
    current->copied->block(step_stream);
    // The memory was allocated on the side stream: keep it until the step's stream is done.
    auto keep = [&](const at::Tensor& t) {
      t.record_stream(step_stream);
      return t;
    };
    current->batch.map(keep);
  }
#endif
  return std::move(current->batch);
}

}  // namespace pipetrain
