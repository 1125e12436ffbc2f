// CUDA graphs of a stage's forward and backward. On a GPU the cost of a pipeline with many
// micro-batches is the CPU's: launching the kernels of one micro-batch through 8 transformer-size
// blocks takes ~3 ms whatever its size, so small micro-batches leave the GPU idle. A captured
// graph replays all of a forward (or backward) in one launch.
//
// A captured forward also captures its autograd graph, whose saved activations live at the
// graph's fixed addresses: so each micro-batch in flight needs graphs of its own. They are kept
// per slot (a micro-batch holds a slot from its forward to its backward; a stage needs as many
// as its schedule keeps in flight) and per input shape, captured on first use: three warm-up
// passes on a side stream, then the forward and the backward (retaining the autograd graph) into
// one memory pool. Under autocast the graphs hold the weights' casts too (autocast's cache is off
// while they are captured), and a micro-batch run with autocast and one without get graphs of
// their own. Deferred weight gradients get graphs of their own, one per sequence of slots
// they are asked for together, captured on first use. Gradients accumulate in place into buffers
// that must outlive the graphs, so the stage adopts them. An optimizer that resets gradients to
// none gets them back at the step's first backward, written by a backward captured with no
// gradients (the first graphs captured have one): as in eager mode, where autograd hands each
// parameter the tensor its backward computed, no pass zeroes them and none adds to zeros (on the
// reference model in one micro-batch on an H200 that took a step from 8.2 ms to eager's 7.0). A
// step whose first backward runs in other graphs, or after eager code gave a parameter a gradient
// (a loss reading the stage's weights), zeroes them first, and so do stages with deferred weight
// gradients, whose graphs add them.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

namespace pipetrain {

class DeferredWeightGradients;

// Turns autocast's cache of bf16 weight copies off for its scope. Anything run under autocast on
// the way to a capture (the first step's check of what a stage returns) runs with it off: a
// cast it cached, even one the capture never reads, makes the capture fail.
class AutocastCacheOff {
 public:
  AutocastCacheOff();
  ~AutocastCacheOff();
  AutocastCacheOff(const AutocastCacheOff&) = delete;
  AutocastCacheOff& operator=(const AutocastCacheOff&) = delete;

 private:
  bool was_;
};

// Whether the backward from `output` reads `output` itself (its last operation kept it, as Tanh
// does): that backward is run with the output's version bumped, as an in-place change would bump
// it, which autograd then refuses. Gradients it reaches accumulate as in any backward.
bool backward_reads_output(const at::Tensor& output);

class StageGraphs {
 public:
  // Whether this build can capture CUDA graphs (Torch with CUDA).
  static bool supported();

  // `input_requires_grad`: whether the stage sends a gradient back (every stage but the first).
  // `deferred`: the stage's fused Linear layers' queue (null if none): backward() then leaves
  // their weight gradients for weight_backward().
  StageGraphs(torch::nn::Sequential stage, bool input_requires_grad,
              DeferredWeightGradients* deferred = nullptr);
  ~StageGraphs();
  StageGraphs(const StageGraphs&) = delete;
  StageGraphs& operator=(const StageGraphs&) = delete;

  // Call before a step's first forward: gradients an optimizer replaced become the buffers the
  // graphs accumulate into again; reset to none, they are left so until the step's first
  // backward writes them (or zeroed, those no first backward writes).
  void adopt_gradients();
  // The forward of one micro-batch in `slot`. The output is a buffer of the slot's graph, valid
  // until the slot's next forward; it carries no autograd graph (backward() is the way back).
  at::Tensor forward(int64_t slot, const at::Tensor& input);
  // The backward of the micro-batch in `slot`, given the gradient of its output: accumulates the
  // parameters' gradients and returns the gradient of its input (a buffer of the slot's graph,
  // valid until the slot's next backward), undefined on the first stage. With deferred weight
  // gradients, those of the fused Linear layers wait for weight_backward().
  at::Tensor backward(int64_t slot, const at::Tensor& grad_output);
  // The deferred weight gradients of the micro-batches in `slots` (after their backward()), each
  // layer's joined into one GEMM (DeferredWeightGradients::accumulate); frees the slots.
  void weight_backward(const std::vector<int64_t>& slots);

 private:
  struct Graphs;
  struct WeightGraph;
  std::unique_ptr<Graphs> capture(const at::Tensor& example);
  // Makes parameter i's gradient the buffer the graphs add into, holding what it held (zeros if
  // none).
  void adopt_gradient(size_t i);
  // Whether a gradient some first backward writes is defined now (eager code gave it one).
  bool written_gradient_defined() const;
  // Replays g's backward, or where the step's gradients start from none, the backward that
  // writes them (g's own, if it has one and nothing gave them a gradient since the step began;
  // else they are adopted and g's adds); returns the input's gradient.
  at::Tensor replay_backward(Graphs& g);

  torch::nn::Sequential stage_;
  bool input_requires_grad_;
  DeferredWeightGradients* deferred_;
  std::vector<at::Tensor> parameters_;
  std::vector<at::Tensor> gradients_;  // what the graphs accumulate into, per parameter
  std::vector<bool> written_;  // per parameter: whether a first backward writes its gradient
  bool starts_fresh_ = false;  // this step's gradients start from none (see adopt_gradients)
  using GraphKey = std::tuple<int64_t, bool, std::vector<int64_t>>;  // slot, autocast, shape
  std::map<GraphKey, std::unique_ptr<Graphs>> graphs_;
  std::map<int64_t, Graphs*> in_flight_;  // slot -> the graphs of its micro-batch
  std::map<std::vector<Graphs*>, std::unique_ptr<WeightGraph>> weight_graphs_;
};

}  // namespace pipetrain
