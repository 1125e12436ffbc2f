// Data parallelism's one job: make every replica's gradients the average over the replicas, and
// do it while backward is still running. As PyTorch's DDP reducer, parameters are grouped into
// buckets of about 25 MiB in reverse order (backward produces the last layers' gradients first);
// a bucket's all-reduce starts as soon as its last gradient has been accumulated, and buckets
// start in the same order on every replica so the collectives match. Under a pipeline, gradients
// accumulate over several micro-batches: only the last backward of a step may start the
// reductions, so the owner arms the sync just before it (Megatron's "grad sync on the last
// micro-batch"). Once its bucket starts, a gradient lives in the bucket's memory (DDP's
// gradient_as_bucket_view), so no gradient is held twice. Parameters may come in groups that never
// share a bucket (ZeRO's owners), so that one group's gradients can be freed without another's.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace pipetrain {

class World;

class GradientSync {
 public:
  static constexpr int64_t kDefaultBucketBytes = 25 << 20;

  // `parameters`: this replica's, identical in order and shape on every replica of `replicas`.
  // `groups`: empty (one group), or each parameter's group, the same on every replica.
  GradientSync(std::vector<at::Tensor> parameters, std::shared_ptr<World> replicas,
               std::vector<int64_t> groups = {}, int64_t bucket_bytes = kDefaultBucketBytes);
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  // The next backward is the step's last: reduce each bucket as soon as it is complete.
  void arm();
  // Starts the buckets backward never completed (parameters this step did not use), waits for
  // every reduction and writes the averages into the gradients. Disarms.
  void finish();

  int64_t num_buckets() const;
  // The parameters of each bucket (indices into the constructor's `parameters`), in launch order.
  std::vector<std::vector<int64_t>> buckets() const;
  // Buckets whose reduction has started since arm().
  int64_t started_buckets() const { return next_bucket_; }

 private:
  struct Bucket;
  void on_gradient_ready(int64_t parameter);
  void launch_ready_buckets();
  void launch(Bucket& bucket);

  std::vector<at::Tensor> parameters_;
  std::shared_ptr<World> replicas_;
  std::vector<Bucket> buckets_;
  std::vector<int64_t> bucket_of_;  // parameter -> bucket
  std::vector<bool> ready_;         // parameter -> gradient final this step
  int64_t next_bucket_ = 0;         // buckets start in index order
  bool armed_ = false;
  std::vector<std::shared_ptr<void>> hooks_;  // keep the grad accumulators (and hooks) alive
};

}  // namespace pipetrain
