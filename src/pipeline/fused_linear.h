// Linear layers whose weight gradient is accumulated inside the GEMM that computes it, as
// Megatron's gradient-accumulation fusion does. With micro-batches every backward of a Linear
// computes its weight gradient into a new tensor and then adds it to .grad: a second pass over a
// buffer as large as the weight, per micro-batch. Here backward runs `grad.addmm_(g^T, x)`, so the
// GEMM's epilogue does the accumulation (in fp32 inside cuBLAS, rounded once into .grad).
//
// A stage can also put those weight-gradient GEMMs off until it has sent its input's gradient to
// the previous stage (the B/W split of zero-bubble pipelines): the previous stage then waits for
// the input-gradient half of the backward alone, which shortens the pipeline's drain.
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include <functional>
#include <memory>
#include <vector>

namespace pipetrain {

// Weight-gradient work the fused Linear layers of one stage left for later. While a Deferral is
// alive their backwards compute only their input's gradient and queue the rest here; run() does
// what is queued, in the order it came.
class DeferredWeightGradients {
 public:
  class Deferral {
   public:
    explicit Deferral(DeferredWeightGradients* queue);  // null: defers nothing
    ~Deferral();
    Deferral(const Deferral&) = delete;
    Deferral& operator=(const Deferral&) = delete;

   private:
    DeferredWeightGradients* queue_;
  };

  bool deferring() const { return deferring_; }
  void add(std::function<void()> work) { pending_.push_back(std::move(work)); }
  void run();
  // Drops what is queued without running it (left by a step that failed half-way).
  void clear() { pending_.clear(); }

 private:
  bool deferring_ = false;
  std::vector<std::function<void()>> pending_;
};

// `layer` itself, or, for a torch::nn::Linear, a module sharing its parameters whose backward
// accumulates their gradients in place, outside autograd (whose graph has no edges to them),
// deferring that work into `deferred` (if given) while it defers.
torch::nn::AnyModule fuse_gradient_accumulation(
    const torch::nn::AnyModule& layer, std::shared_ptr<DeferredWeightGradients> deferred = nullptr);

}  // namespace pipetrain
