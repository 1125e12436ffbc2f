// How a rank computes its stages' micro-batches: the forward (F), the backward (B, or its input
// half I) and the weight half (W), behind one interface with two implementations. Eager runs the
// layers through autograd, recomputing the micro-batches the checkpoint mode names and splitting
// backwards where the schedule does; CUDA graphs replay a captured forward and backward per
// micro-batch slot (stage_graphs.h). The Pipe picks one at construction (Pipe::execution() says
// which, and why) and runs the same plan loop with either: the order of actions, the transfers
// and the loss head are the Pipe's, what one action computes is the execution's.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

#include <functional>
#include <memory>
#include <vector>

#include "distributed/p2p.h"
#include "ops/fused_linear.h"
#include "pipeline/recompute.h"
#include "split_backward.h"
#include "stage_value.h"

namespace pipetrain {

class World;

// What a stage keeps of one micro-batch from its forward to its last backward action.
struct InFlight {
  StageValue input;   // floating tensors require grad on every stage but the first
  StageValue output;  // with its autograd graph, unless recomputed or replayed
  at::Tensor loss;    // last stage only: scaled loss, graph back to `output`
  bool recomputed = false;
  RngState rng;       // the generator before the forward, for the recompute
  int64_t slot = -1;  // under CUDA graphs, the graphs holding this micro-batch
  // Between an I and its W: the weight gradients still to compute, through autograd and of the
  // fused Linear layers.
  WeightBackward weights;
  std::vector<WeightGradient> fused;
};

// The stage's layers run on an input (with autograd as the grad mode says): the Pipe's, which
// names the stage in its errors.
using RunStage = std::function<StageValue(const StageValue& input)>;

class StageExecution {
 public:
  virtual ~StageExecution() = default;

  // Before a step's first forward.
  virtual void start_step() {}
  // F: state.output from state.input (and what the backward will need).
  virtual void forward(InFlight& state, const RunStage& run) = 0;
  // Whether state.output comes without the stage's autograd graph (recomputed or replayed), so
  // that the loss head must start from a leaf and hand its gradient to backward().
  virtual bool output_detached(const InFlight& state) const = 0;
  // B, or I where `split`: given the gradients of the outputs that take one (in their order; the
  // last stage's own loss where the output is attached), returns the gradients of `inputs` (the
  // inputs that take one; zeros where an input had no effect). `rerun` runs the stage again with
  // autograd, for a recomputed micro-batch. An I leaves its weight half in `state` for W.
  virtual std::vector<at::Tensor> backward(InFlight& state,
                                           const std::vector<at::Tensor>& grad_outputs,
                                           const std::vector<at::Tensor>& inputs, bool split,
                                           const RunStage& rerun) = 0;
  // W: the weight half an I left.
  virtual void weight_backward(InFlight& state) = 0;
  // The fused Linear layers' weight gradients their backwards put off, of the micro-batches in
  // `slots` (under CUDA graphs; eager runs whatever is queued).
  virtual void fused_weight_gradients(const std::vector<int64_t>& slots) = 0;
  // The micro-batch in `slot` is done with: its buffers may be reused.
  virtual void release(int64_t /*slot*/) {}
  // `work` sends tensors out of the buffers of `slot` (activations, or gradients): the slot's next
  // forward (backward) must wait for it.
  virtual void sending(int64_t /*slot*/, bool /*gradients*/, WorkPtr /*work*/) {}
};

// `deferred`: the stage's fused Linear queue (null if none).
std::unique_ptr<StageExecution> eager_execution(std::shared_ptr<DeferredWeightGradients> deferred);

// One stage per rank, of one floating tensor in (but on the first stage) and one out (see
// Pipe::check_graphs_fit); `first_stage`: its input takes no gradient.
std::unique_ptr<StageExecution> graph_execution(torch::nn::Sequential stage, bool first_stage,
                                                std::shared_ptr<DeferredWeightGradients> deferred,
                                                std::shared_ptr<World> world);

}  // namespace pipetrain
