#include "train/layer_profile.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <stdexcept>
#include <string>

#include "pipeline/stage_value.h"
#include "train/memory_report.h"

namespace pipetrain {
namespace {

int64_t bytes_of(const std::vector<at::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const auto& t : tensors) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

// Seconds since `start`, once `device`'s queued work is done.
double seconds_since(std::chrono::steady_clock::time_point start, const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int64_t counted(int64_t bytes) {
  if (bytes < 0) {
    throw std::runtime_error(
        "profiling layers needs pipetrain's counting CPU allocator, but another allocator of "
        "higher priority is installed");
  }
  return bytes;
}

}  // namespace

LayerProfile profile_layers(int64_t count,
                            const std::function<torch::nn::AnyModule(int64_t)>& build,
                            const at::Tensor& sample, const c10::Device& device, int repeats,
                            const OptimizerFactory& optimizer) {
  if (repeats < 1) {
    throw std::invalid_argument("profile_layers needs at least 1 timed run per layer, got " +
                                std::to_string(repeats));
  }
  LayerProfile profile;
  profile.rows = sample.size(0);
  StageValue input = StageValue::of(sample.to(device));
  profile.input_bytes = bytes_of(input.tensors);
  for (int64_t index = 0; index < count; ++index) {
    torch::nn::AnyModule layer = build(index);
    layer.ptr()->to(device);
    LayerCost cost;
    for (const auto& p : layer.ptr()->parameters()) {
      (p.requires_grad() ? cost.parameter_bytes : cost.buffer_bytes) +=
          static_cast<int64_t>(p.nbytes());
    }
    for (const auto& b : layer.ptr()->buffers()) {
      cost.buffer_bytes += static_cast<int64_t>(b.nbytes());
    }
    // The input as a stage gets it: detached, its floating-point tensors wanting gradients.
    StageValue x = input;
    std::vector<at::Tensor> differentiable;
    for (auto& t : x.tensors) {
      t = t.detach();
      if (t.is_floating_point()) {
        t.requires_grad_(true);
        differentiable.push_back(t);
      }
    }
    cost.forward_seconds = cost.backward_seconds = cost.input_backward_seconds =
        std::numeric_limits<double>::infinity();
    StageValue output;
    for (int run = 0; run <= repeats; ++run) {
      output = StageValue();  // freed before the meter starts, not counted against this run
      std::vector<at::Tensor> roots, seeds;
      {
        StepMemoryMeter meter(device);
        auto start = std::chrono::steady_clock::now();
        output = StageValue::unpack(layer.any_forward(x.pack()), index);
        const double forward = seconds_since(start, device);
        const int64_t held = counted(meter.held());
        for (const auto& t : output.tensors) {
          if (!t.requires_grad()) continue;
          roots.push_back(t);
          seeds.push_back(torch::ones_like(t));
        }
        start = std::chrono::steady_clock::now();
        if (!roots.empty()) torch::autograd::backward(roots, seeds);
        const double backward = seconds_since(start, device);
        if (run > 0) {
          cost.forward_seconds = std::min(cost.forward_seconds, forward);
          cost.backward_seconds = std::min(cost.backward_seconds, backward);
        }
        // After the warm-up the gradients exist, as they do for every micro-batch of a step but
        // the first: a backward computes each weight gradient apart, then adds it in.
        if (run > 0) {
          cost.activation_bytes = held;
          cost.workspace_bytes = std::max<int64_t>(0, counted(meter.peak()) - held);
        }
      }
      // The input gradient alone, on a graph of its own.
      double input_backward = 0;
      if (!differentiable.empty()) {
        const auto again = StageValue::unpack(layer.any_forward(x.pack()), index);
        std::vector<at::Tensor> again_roots;
        for (const auto& t : again.tensors) {
          if (t.requires_grad()) again_roots.push_back(t);
        }
        if (!again_roots.empty()) {
          const auto start = std::chrono::steady_clock::now();
          torch::autograd::grad(again_roots, differentiable, seeds, /*retain_graph=*/false,
                                /*create_graph=*/false, /*allow_unused=*/true);
          input_backward = seconds_since(start, device);
        }
      }
      if (run > 0)
        cost.input_backward_seconds = std::min(cost.input_backward_seconds, input_backward);
    }
    cost.input_backward_seconds = std::min(cost.input_backward_seconds, cost.backward_seconds);
    std::vector<at::Tensor> trained;
    for (const auto& p : layer.ptr()->parameters()) {
      if (p.requires_grad() && p.grad().defined()) trained.push_back(p);
    }
    if (optimizer && !trained.empty()) {
      // Its state is made by the first step, which is not timed; the weights it changes are
      // dropped with the layer.
      const auto stepper = optimizer(trained);
      cost.optimizer_seconds = std::numeric_limits<double>::infinity();
      for (int run = 0; run <= repeats; ++run) {
        const auto start = std::chrono::steady_clock::now();
        stepper->step();
        const double seconds = seconds_since(start, device);
        if (run > 0) cost.optimizer_seconds = std::min(cost.optimizer_seconds, seconds);
      }
    }
    for (auto& t : output.tensors) t = t.detach();
    cost.output_bytes = bytes_of(output.tensors);
    profile.layers.push_back(cost);
    input = std::move(output);
  }
  return profile;
}

}  // namespace pipetrain
