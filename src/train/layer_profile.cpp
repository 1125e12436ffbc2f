#include "train/layer_profile.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <stdexcept>
#include <string>

#include "pipeline/recompute.h"
#include "pipeline/split_backward.h"
#include "pipeline/stage_value.h"
#include "pipetrain/module.h"
#include "train/memory_report.h"
#include "train/precision.h"

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

// One layer on one input (replaced by the layer's output): its times and bytes.
LayerCost measure(torch::nn::AnyModule& layer, int64_t index, StageValue& input,
                  const c10::Device& device, int repeats) {
  LayerCost cost;
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
  cost.input_differentiable = !differentiable.empty();
  cost.forward_seconds = cost.backward_seconds = cost.input_backward_seconds =
      cost.weight_backward_seconds = std::numeric_limits<double>::infinity();
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
    // The backward split as zero-bubble schedules run it (split_backward.h): the input
    // gradient, then the weight gradients, and what the first half keeps for the second.
    {
      StepMemoryMeter meter(device);
      const auto again = StageValue::unpack(layer.any_forward(x.pack()), index);
      std::vector<at::Tensor> again_roots;
      for (const auto& t : again.tensors) {
        if (t.requires_grad()) again_roots.push_back(t);
      }
      double input_backward = 0, weight_backward = 0;
      int64_t split_held = 0;
      if (!again_roots.empty() && differentiable.empty()) {
        // Nothing to send back (tokens in): all of it is weight gradients.
        const auto start = std::chrono::steady_clock::now();
        torch::autograd::backward(again_roots, seeds);
        weight_backward = seconds_since(start, device);
      } else if (!again_roots.empty()) {
        const int64_t held = counted(meter.held());
        std::vector<at::Tensor> input_grads;
        auto start = std::chrono::steady_clock::now();
        WeightBackward weights =
            WeightBackward::input_backward(again_roots, seeds, differentiable, &input_grads);
        input_backward = seconds_since(start, device);
        input_grads.clear();
        split_held = counted(meter.held()) - held;
        start = std::chrono::steady_clock::now();
        weights.run();
        weight_backward = seconds_since(start, device);
      }
      if (run > 0) {
        cost.input_backward_seconds = std::min(cost.input_backward_seconds, input_backward);
        cost.weight_backward_seconds = std::min(cost.weight_backward_seconds, weight_backward);
        cost.split_held_bytes = std::max<int64_t>(0, split_held);
      }
    }
  }
  for (auto& t : output.tensors) t = t.detach();
  cost.output_bytes = bytes_of(output.tensors);
  input = std::move(output);
  return cost;
}

}  // namespace

std::vector<LayerProfile> profile_layers(int64_t count,
                                         const std::function<torch::nn::AnyModule(int64_t)>& build,
                                         const std::vector<at::Tensor>& samples,
                                         const c10::Device& device, int repeats,
                                         const OptimizerFactory& optimizer) {
  if (repeats < 1) {
    throw std::invalid_argument("profile_layers needs at least 1 timed run per layer, got " +
                                std::to_string(repeats));
  }
  // Dropout draws here must not move the run's random numbers.
  const RngState rng = RngState::capture(device);
  std::vector<LayerProfile> profiles(samples.size());
  std::vector<StageValue> inputs;  // each sample's, as the layers so far made it
  for (size_t k = 0; k < samples.size(); ++k) {
    inputs.push_back(StageValue::of(samples[k].to(device)));
    profiles[k].rows = samples[k].size(0);
    profiles[k].input_bytes = bytes_of(inputs[k].tensors);
  }
  for (int64_t index = 0; index < count; ++index) {
    torch::nn::AnyModule layer = build(index);
    // A layer lent by a model built whole goes back as it came: its weights, buffers and device.
    std::vector<at::Tensor> tensors, kept;
    for (const auto& p : layer.ptr()->parameters()) tensors.push_back(p);
    for (const auto& b : layer.ptr()->buffers()) tensors.push_back(b);
    for (const auto& t : tensors) kept.push_back(t.detach().clone());
    const c10::Device home = tensors.empty() ? c10::Device(c10::kCPU) : tensors.front().device();
    layer.ptr()->to(device);
    int64_t parameter_bytes = 0, buffer_bytes = 0;
    for (const auto& p : layer.ptr()->parameters()) {
      (p.requires_grad() ? parameter_bytes : buffer_bytes) += static_cast<int64_t>(p.nbytes());
    }
    for (const auto& b : layer.ptr()->buffers()) buffer_bytes += static_cast<int64_t>(b.nbytes());
    for (size_t k = 0; k < samples.size(); ++k) {
      LayerCost cost = measure(layer, index, inputs[k], device, repeats);
      cost.parameter_bytes = parameter_bytes;
      cost.buffer_bytes = buffer_bytes;
      profiles[k].layers.push_back(cost);
    }
    std::vector<at::Tensor> trained;
    for (const auto& p : layer.ptr()->parameters()) {
      if (p.requires_grad() && p.grad().defined()) trained.push_back(p);
    }
    if (optimizer && !trained.empty()) {
      // Its state is made by the first step, which is not timed; the weights it changes are put
      // back below.
      const auto stepper = optimizer(trained);
      double fastest = std::numeric_limits<double>::infinity();
      for (int run = 0; run <= repeats; ++run) {
        const auto start = std::chrono::steady_clock::now();
        stepper->step();
        const double seconds = seconds_since(start, device);
        if (run > 0) fastest = std::min(fastest, seconds);
      }
      for (auto& profile : profiles) profile.layers.back().optimizer_seconds = fastest;
    }
    torch::NoGradGuard no_grad;
    layer.ptr()->to(home);
    size_t i = 0;
    for (auto& p : layer.ptr()->parameters()) {
      p.mutable_grad() = at::Tensor();
      p.copy_(kept[i++]);
    }
    for (auto& b : layer.ptr()->buffers()) b.copy_(kept[i++]);
  }
  rng.restore();
  return profiles;
}

std::map<int64_t, LayerProfile> profile_module(const Module& module, const at::Tensor& inputs,
                                               const c10::Device& device,
                                               const std::string& precision, int repeats) {
  const auto& specs = module.layer_specs();
  const auto whole = module.layers();
  const auto count = static_cast<int64_t>(specs.empty() ? whole->size() : specs.size());
  // Which layer first holds each tensor of a model built whole, and what each layer shares.
  std::map<const c10::TensorImpl*, int64_t> first_holder;
  std::vector<std::map<int64_t, int64_t>> shared(static_cast<size_t>(count));
  auto build = [&](int64_t index) {
    torch::nn::AnyModule layer =
        specs.empty() ? *(whole->begin() + index) : specs[static_cast<size_t>(index)].build();
    auto& mine = shared[static_cast<size_t>(index)];
    if (specs.empty()) {
      for (const auto& p : layer.ptr()->parameters()) {
        if (!p.requires_grad()) continue;
        const auto [it, first] = first_holder.emplace(p.unsafeGetTensorImpl(), index);
        if (!first && it->second != index) mine[it->second] += static_cast<int64_t>(p.nbytes());
      }
    } else if (specs[static_cast<size_t>(index)].build_sharing) {
      // Built sharing the tensors of the layers it is tied to where one process holds them all.
      const auto parameters = layer.ptr()->named_parameters();
      for (const auto& [own, global] : specs[static_cast<size_t>(index)].tied_to) {
        const auto* p = parameters.find(own);
        if (p == nullptr || !p->requires_grad()) continue;
        mine[std::stoll(global.substr(0, global.find('.')))] += static_cast<int64_t>(p->nbytes());
      }
    }
    torch::nn::Sequential one;
    one->push_back(layer);
    convert_module(one, precision);
    return layer;
  };
  auto adamw = [](std::vector<at::Tensor> parameters) {
    return std::unique_ptr<torch::optim::Optimizer>(
        std::make_unique<torch::optim::AdamW>(std::move(parameters)));
  };
  // Under bf16-mixed the layers run under autocast, as the steps will.
  PrecisionGuard autocast(precision, device.type());
  std::vector<int64_t> chunk_counts;
  std::vector<at::Tensor> samples;
  const int64_t rows = inputs.size(0);
  for (int64_t chunks = 1; chunks <= 32 && chunks <= rows; chunks *= 2) {
    if (rows % chunks != 0) continue;
    chunk_counts.push_back(chunks);
    samples.push_back(inputs.narrow(0, 0, rows / chunks));
  }
  const auto measured = profile_layers(count, build, samples, device, repeats, adamw);
  std::map<int64_t, LayerProfile> profiles;
  for (size_t k = 0; k < chunk_counts.size(); ++k) {
    LayerProfile& profile = profiles[chunk_counts[k]] = measured[k];
    for (size_t i = 0; i < profile.layers.size(); ++i) {
      profile.layers[i].shared_parameter_bytes = shared[i];
    }
  }
  return profiles;
}

}  // namespace pipetrain
