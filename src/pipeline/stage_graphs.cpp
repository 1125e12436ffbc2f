#include "stage_graphs.h"

#include <torch/torch.h>

#ifdef PIPETRAIN_HAS_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include <algorithm>
#include <stdexcept>
#include <string>

#include "ops/fused_linear.h"
#include "util/compat.h"

namespace pipetrain {

bool backward_reads_output(const at::Tensor& output) {
  torch::autograd::impl::bump_version(output);
  try {
    output.backward(torch::ones_like(output));
  } catch (const c10::Error& e) {
    if (std::string(e.what()).find("modified by an inplace operation") != std::string::npos) {
      return true;
    }
    throw;
  }
  return false;
}

#ifdef PIPETRAIN_HAS_CUDA

namespace {

constexpr int kWarmups = 3;

// `waiter` waits (on the GPU) for what is already queued on `done`.
void stream_wait(const at::cuda::CUDAStream& waiter, const at::cuda::CUDAStream& done) {
  at::cuda::CUDAEvent event;
  event.record(done);
  event.block(waiter);
}

}  // namespace

struct StageGraphs::Graphs {
  at::Tensor input, output, grad_output, grad_input;  // the graphs' fixed buffers
  at::cuda::CUDAGraph forward, backward;
  // In the graphs captured first (without deferred weight gradients): the backward that writes
  // the gradients instead of adding to them, and the input gradient it writes.
  std::unique_ptr<at::cuda::CUDAGraph> first_backward;
  at::Tensor first_grad_input;
  // What backward leaves for weight_backward(): held so that its tensors keep their addresses.
  std::vector<WeightGradient> weight_gradients;
  // Whether the backward reads the output (the stage's last layer saved it, as a Tanh does), and
  // the output's version after the forward's replay: an output changed in place since (by an
  // in-place loss) would be read changed by a replay, where eager autograd refuses it.
  bool output_read_by_backward = false;
  int64_t output_version = 0;
};

struct StageGraphs::WeightGraph {
  at::cuda::CUDAGraph graph;
};

bool StageGraphs::supported() { return true; }

StageGraphs::StageGraphs(torch::nn::Sequential stage, bool input_requires_grad,
                         DeferredWeightGradients* deferred)
    : stage_(std::move(stage)), input_requires_grad_(input_requires_grad), deferred_(deferred) {
  for (const auto& p : stage_->parameters()) {
    if (p.requires_grad()) parameters_.push_back(p);
  }
}

StageGraphs::~StageGraphs() = default;

void StageGraphs::adopt_gradients() {
  if (gradients_.empty()) return;  // nothing captured yet
  // Reset to none, every gradient the first backward writes is left so until that backward.
  starts_fresh_ = std::find(written_.begin(), written_.end(), true) != written_.end() &&
                  !written_gradient_defined();
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (!(starts_fresh_ && written_[i])) adopt_gradient(i);
  }
}

bool StageGraphs::written_gradient_defined() const {
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (written_[i] && parameters_[i].grad().defined()) return true;
  }
  return false;
}

void StageGraphs::adopt_gradient(size_t i) {
  torch::NoGradGuard no_grad;
  at::Tensor& p = parameters_[i];
  const at::Tensor grad = p.grad();
  if (!grad.defined()) {
    gradients_[i].zero_();
  } else if (!grad.is_same(gradients_[i])) {
    gradients_[i].copy_(grad);
  } else {
    return;
  }
  p.mutable_grad() = gradients_[i];
}

at::Tensor StageGraphs::replay_backward(Graphs& g) {
  if (starts_fresh_) {
    starts_fresh_ = false;
    // Eager code since the step began (a loss reading the stage's parameters) may have given
    // some a gradient, which the backward must add to.
    if (g.first_backward && !written_gradient_defined()) {
      g.first_backward->replay();
      for (size_t i = 0; i < parameters_.size(); ++i) {
        if (written_[i]) parameters_[i].mutable_grad() = gradients_[i];
      }
      return g.first_grad_input;
    }
    for (size_t i = 0; i < parameters_.size(); ++i) {
      if (written_[i]) adopt_gradient(i);
    }
  }
  g.backward.replay();
  return g.grad_input;
}

std::unique_ptr<StageGraphs::Graphs> StageGraphs::capture(const at::Tensor& example) {
  auto g = std::make_unique<Graphs>();
  g->input = example.detach().clone().requires_grad_(input_requires_grad_);
  // A capture may come mid-step: what the gradients hold now is put back afterwards (the
  // warm-ups add to them, the captures run nothing).
  std::vector<at::Tensor> held;
  for (const auto& p : parameters_) {
    held.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
  }
  const bool first_capture = gradients_.empty();

  const auto caller = at::cuda::getCurrentCUDAStream();
  const auto side = at::cuda::getStreamFromPool();
  stream_wait(side, caller);
  {
    const at::cuda::CUDAStreamGuard guard(side);
    // Under autocast (bf16-mixed) the graphs cast the weights themselves at every replay: its
    // cache of bf16 copies lives for one step, outside any graph, and a replay would read copies
    // freed since.
    const AutocastCacheOff cache_off;
    at::autocast::clear_cache();  // what was cast before, with the cache on (see the header)
    for (int i = 0; i < kWarmups; ++i) {
      auto out = stage_->forward(g->input);
      if (i == 0) {
        g->output_read_by_backward = backward_reads_output(out);  // a warm-up too
      } else {
        out.backward(torch::ones_like(out));
      }
      g->grad_output = torch::zeros_like(out);
    }
    // Captured with no gradient yet, the input's gradient is written afresh at every replay.
    if (input_requires_grad_) g->input.mutable_grad() = at::Tensor();
    g->forward.capture_begin();
    g->output = stage_->forward(g->input);
    g->forward.capture_end();
    if (first_capture) {
      // Captured with no gradients, autograd hands each parameter the tensor its backward
      // computed (eager mode's first backward does the same): those become the buffers every
      // graph adds into. A deferred weight gradient is computed by a graph of its own, which
      // adds: those stay buffers of zeros.
      if (!deferred_) {
        for (auto& p : parameters_) p.mutable_grad() = at::Tensor();
        g->first_backward = std::make_unique<at::cuda::CUDAGraph>();
        g->first_backward->capture_begin(g->forward.pool());
        torch::autograd::backward({g->output}, {g->grad_output}, /*retain_graph=*/true);
        g->first_backward->capture_end();
        if (input_requires_grad_) {
          g->first_grad_input = g->input.grad();
          g->input.mutable_grad() = at::Tensor();
        }
      }
      for (auto& p : parameters_) {
        written_.push_back(!deferred_ && p.grad().defined());
        gradients_.push_back(written_.back() ? p.grad() : torch::zeros_like(p));
      }
    }
    for (size_t i = 0; i < parameters_.size(); ++i) {
      parameters_[i].mutable_grad() = gradients_[i];
    }
    g->backward.capture_begin(g->forward.pool());
    {
      DeferredWeightGradients::Deferral deferral(deferred_);
      torch::autograd::backward({g->output}, {g->grad_output}, /*retain_graph=*/true);
    }
    g->backward.capture_end();
    if (deferred_) g->weight_gradients = deferred_->take();
    if (input_requires_grad_) g->grad_input = g->input.grad();
  }
  stream_wait(caller, side);
  // Back to what the step held, in the buffers; then as at a step's start.
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < parameters_.size(); ++i) {
      if (held[i].defined()) gradients_[i].copy_(held[i]);
      parameters_[i].mutable_grad() = held[i].defined() ? gradients_[i] : at::Tensor();
    }
  }
  adopt_gradients();
  return g;
}

at::Tensor StageGraphs::forward(int64_t slot, const at::Tensor& input) {
  // A graph replays the casts (or their absence) of the autocast state it was captured in.
  const GraphKey key{slot, autocast_enabled(c10::DeviceType::CUDA), input.sizes().vec()};
  auto it = graphs_.find(key);
  if (it == graphs_.end()) it = graphs_.emplace(key, capture(input)).first;
  Graphs& g = *it->second;
  {
    torch::NoGradGuard no_grad;
    g.input.copy_(input);
  }
  g.forward.replay();
  g.output_version = g.output._version();
  in_flight_[slot] = &g;
  return g.output.detach();
}

at::Tensor StageGraphs::backward(int64_t slot, const at::Tensor& grad_output) {
  Graphs& g = *in_flight_.at(slot);
  if (g.output_read_by_backward && g.output._version() != g.output_version) {
    throw std::runtime_error(
        "pipetrain: a stage's output was changed in place after its forward (an in-place loss "
        "such as chunked_cross_entropy_ writes its gradient over the logits), and the stage's "
        "backward reads that output (its last layer keeps it, as Tanh does): eager autograd "
        "refuses this too, and a CUDA graph would read the changed values: compute the loss out "
        "of place (chunked_cross_entropy), or end the stage with a layer that does not keep its "
        "output");
  }
  {
    torch::NoGradGuard no_grad;
    g.grad_output.copy_(grad_output);
  }
  const at::Tensor grad_input = replay_backward(g);
  if (!deferred_) in_flight_.erase(slot);
  return grad_input;
}

void StageGraphs::weight_backward(const std::vector<int64_t>& slots) {
  std::vector<Graphs*> key;
  for (const int64_t slot : slots) {
    key.push_back(in_flight_.at(slot));
    in_flight_.erase(slot);
  }
  if (auto it = weight_graphs_.find(key); it != weight_graphs_.end()) {
    it->second->graph.replay();
    return;
  }
  std::vector<WeightGradient> work;
  for (const Graphs* g : key) {
    work.insert(work.end(), g->weight_gradients.begin(), g->weight_gradients.end());
  }
  if (work.empty()) return;  // no fused Linear on this stage
  // First time for these slots: run eagerly on a side stream (which also readies cuBLAS there),
  // then capture the same work for the next steps.
  auto captured = std::make_unique<WeightGraph>();
  const auto caller = at::cuda::getCurrentCUDAStream();
  const auto side = at::cuda::getStreamFromPool();
  stream_wait(side, caller);
  {
    const at::cuda::CUDAStreamGuard guard(side);
    DeferredWeightGradients::accumulate(work);
    captured->graph.capture_begin();
    DeferredWeightGradients::accumulate(work);
    captured->graph.capture_end();
  }
  stream_wait(caller, side);
  weight_graphs_.emplace(std::move(key), std::move(captured));
}

#endif

AutocastCacheOff::AutocastCacheOff() : was_(at::autocast::is_autocast_cache_enabled()) {
  at::autocast::set_autocast_cache_enabled(false);
}

AutocastCacheOff::~AutocastCacheOff() { at::autocast::set_autocast_cache_enabled(was_); }

#ifndef PIPETRAIN_HAS_CUDA

struct StageGraphs::Graphs {};
struct StageGraphs::WeightGraph {};

bool StageGraphs::supported() { return false; }

StageGraphs::StageGraphs(torch::nn::Sequential stage, bool input_requires_grad,
                         DeferredWeightGradients* deferred)
    : stage_(std::move(stage)), input_requires_grad_(input_requires_grad), deferred_(deferred) {
  throw std::runtime_error("CUDA graphs need a libtorch with CUDA");
}

StageGraphs::~StageGraphs() = default;
void StageGraphs::adopt_gradients() {}
std::unique_ptr<StageGraphs::Graphs> StageGraphs::capture(const at::Tensor&) { return nullptr; }
at::Tensor StageGraphs::forward(int64_t, const at::Tensor&) { return {}; }
at::Tensor StageGraphs::backward(int64_t, const at::Tensor&) { return {}; }
void StageGraphs::weight_backward(const std::vector<int64_t>&) {}

#endif

}  // namespace pipetrain
