// Tensors between neighbouring stages. Users never declare stage shapes: every message is preceded
// by a small header (dtype, rank, dims) so the receiver can allocate the right buffer. Sends are
// asynchronous and only awaited at the end of a step, so two stages sending to each other at the
// same moment (1F1B's steady state) never wait on each other.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
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

  // Starts sending `tensor` to rank `dst`; the tensor is kept alive until wait_for_sends().
  void send(const at::Tensor& tensor, int64_t dst, Flow flow);
  // Blocks (up to the world's timeout) until rank `src` sends the next tensor of `flow`.
  at::Tensor recv(int64_t src, Flow flow);
  // Waits until every started send has completed.
  void wait_for_sends();

 private:
  std::shared_ptr<World> world_;
  std::vector<WorkPtr> pending_sends_;
  std::vector<at::Tensor> pending_tensors_;
};

}  // namespace pipetrain
