// torchgpipe's DeferredBatchNorm. Under micro-batching a BatchNorm layer normalises each
// micro-batch by that micro-batch's statistics (its forward runs before the next micro-batch
// exists), and would update its running statistics once per micro-batch, ending with those of the
// last ones. With PipeOptions::deferred_batch_norm the stage's BatchNorm layers are swapped for
// this module, which shares their parameters and buffers, adds up every micro-batch's sums and
// updates the running statistics once per batch, from the whole batch, as one process running the
// batch at once would.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/pimpl.h>

#include <c10/util/Optional.h>
#include <memory>
#include <vector>

namespace pipetrain {

class DeferredBatchNormImpl : public torch::nn::Cloneable<DeferredBatchNormImpl> {
 public:
  // `original` is the BatchNorm stood in for: its train()/eval() mode, which the Trainer sets on
  // the whole Sequential, is this module's.
  DeferredBatchNormImpl(std::shared_ptr<torch::nn::Module> original, at::Tensor weight,
                        at::Tensor bias, at::Tensor running_mean, at::Tensor running_var,
                        at::Tensor num_batches_tracked, c10::optional<double> momentum, double eps);
  void reset() override {}

  // Training: normalises by `input`'s own statistics and adds them to the batch's (unless a
  // recomputation runs). Evaluation: normalises by the running statistics.
  at::Tensor forward(const at::Tensor& input);
  // Folds the batch's statistics into the running ones (once per batch) and starts a new batch.
  void commit();
  // Forgets the batch's statistics (a failed step).
  void discard();
  // While set, forward() adds nothing: a recomputed forward has been counted already.
  void set_recomputing(bool recomputing) { recomputing_ = recomputing; }

 private:
  std::shared_ptr<torch::nn::Module> original_;
  at::Tensor weight_, bias_, running_mean_, running_var_, num_batches_tracked_;
  c10::optional<double> momentum_;  // none: a cumulative average, as BatchNorm's
  double eps_;
  bool recomputing_ = false;
  at::Tensor sum_, sum_of_squares_;  // per channel, over the batch's micro-batches so far
  int64_t count_ = 0;                // values per channel so far
};
TORCH_MODULE(DeferredBatchNorm);

// `layer` itself, or, for a BatchNorm1d/2d/3d that tracks running statistics, a DeferredBatchNorm
// sharing its parameters and buffers, which is also added to `swapped`.
torch::nn::AnyModule defer_batch_norm(const torch::nn::AnyModule& layer,
                                      std::vector<DeferredBatchNorm>& swapped);

}  // namespace pipetrain
