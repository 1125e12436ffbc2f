// ZeRO stage 1 (Rajbhandari et al., 2020): the replicas of a stage hold the same parameters and,
// after GradientSync, the same gradients, so each needs only its part of the optimizer's state.
// Every trainable parameter has one owner among the replicas, chosen by size so that each owns
// about as many bytes (whole tensors, as PyTorch's ZeroRedundancyOptimizer partitions them, so any
// optimizer works unchanged on its part); each replica's optimizer holds and steps only the
// parameters it owns, and after the step each owner broadcasts them to the other replicas.
// Gradients are whole on every replica until the step (all-reduced as under plain data
// parallelism): the global gradient norm and clipping see every gradient, as in one process. Then
// the others' are freed: GradientSync's buckets follow the owners, so whole buckets go.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace pipetrain {

class World;

class ZeroPartition {
 public:
  static constexpr int64_t kBroadcastBucketBytes = 25 << 20;

  // `parameters`: this replica's, identical in order, shape and dtype on every replica of
  // `replicas`.
  ZeroPartition(std::vector<at::Tensor> parameters, std::shared_ptr<World> replicas);

  // Leaves in `optimizer`'s parameter groups only the parameters this replica owns (and any that
  // are not among the partition's, which are not the partition's to share out). Throws
  // std::logic_error when the optimizer already holds state: the partition must come first.
  void shard(torch::optim::Optimizer& optimizer) const;
  // Before the optimizer step, once clipping has read every gradient: frees the gradients of the
  // parameters other replicas own (this one's optimizer neither reads nor clears them).
  void drop_others_gradients();
  // After the owners' optimizer steps: every replica gets the owners' new values. A collective
  // over the replicas.
  void broadcast_parameters();

  // Each parameter's owner among the replicas, -1 for one not trained.
  const std::vector<int64_t>& owners() const { return owners_; }
  // Bytes of trainable parameters this replica owns, and in all.
  int64_t owned_bytes() const;
  int64_t total_bytes() const;

 private:
  std::vector<at::Tensor> parameters_;
  std::shared_ptr<World> replicas_;
  std::vector<int64_t> bytes_;   // parameter -> its size
  std::vector<int64_t> owners_;  // parameter -> replica, -1: not trained
};

}  // namespace pipetrain
