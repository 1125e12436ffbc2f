// Tensors between neighbouring stages. Users never declare stage shapes: the first tensor of each
// direction in a step is preceded by a small header (dtype, dims) so the receiver can allocate
// it; the rest of the step's tensors have the same shape apart from dim 0, the micro-batch's
// rows, which both sides know. One header per step, not per micro-batch, because on a GPU reading
// a header means waiting for it on the host. Sends are asynchronous and only awaited at the end
// of a step, so two stages sending to each other at the same moment (1F1B's steady state) never
// wait on each other; activations and gradients travel in process groups of their own (on NCCL,
// streams of their own) for the same reason.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "pipetrain/compat.h"

namespace pipetrain {

class World;

// The two directions of a pipeline (activations to the next stage, gradients to the previous), and
// results gathered outside the schedule (predictions, weights), each with tags of its own.
enum class Flow { kActivation, kGradient, kResult };

class PeerToPeer {
 public:
  explicit PeerToPeer(std::shared_ptr<World> world);

  // Starts sending `tensor` (of the world's device) to rank `dst`; the tensor is kept alive until
  // wait_for_sends(). Within a step, every tensor of a flow must have the first one's shape but
  // for dim 0 (pipeline stages pass batch-first tensors on); results may have any shape. Returns
  // the send, for callers that must not overwrite the tensor before it has gone.
  WorkPtr send(const at::Tensor& tensor, int64_t dst, Flow flow);
  // Receives the next tensor of `flow` from rank `src`, which has `rows` rows (dim 0) unless it is
  // the first of the step. On CUDA it returns at once, the current stream waiting for the data.
  // Blocks (up to the world's timeout) on CPU, and for headers.
  at::Tensor recv(int64_t src, Flow flow, int64_t rows = -1);
  // Waits until every started send has completed, and starts a new step: the next tensor of each
  // flow carries a header again.
  void wait_for_sends();

 private:
  struct Shape {
    c10::ScalarType dtype;
    std::vector<int64_t> sizes;
  };
  const ProcessGroupPtr& group(Flow flow) const;

  std::shared_ptr<World> world_;
  std::shared_ptr<World> gradients_;  // a twin of world_ carrying gradients only
  struct Send {
    WorkPtr work;
    int64_t dst;
    at::Tensor tensor;  // alive until the send completes
  };
  std::vector<Send> pending_sends_;
  // What this step's first header said, per (peer, flow).
  std::map<std::pair<int64_t, Flow>, Shape> sent_, received_;
};

}  // namespace pipetrain
