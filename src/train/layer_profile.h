// What each layer of a model costs for one micro-batch, measured on the device at hand: the
// forward and backward times (whole, and split in its input and weight halves)
// and the bytes it holds from its forward to its backward. The planner's inputs: from them it
// predicts any balance's, schedule's and recompute mode's step time and memory.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/modules/container/any.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace pipetrain {

struct LayerCost {
  double forward_seconds = 0;
  double backward_seconds = 0;         // input and weight gradients together (a whole B)
  double input_backward_seconds = 0;   // a split backward's first half: the input gradient (I)
  double weight_backward_seconds = 0;  // and its second: the weight gradients (W)
  double optimizer_seconds = 0;        // one optimizer step over its parameters
  int64_t activation_bytes = 0;        // held from its forward to its backward, its output included
  int64_t output_bytes = 0;            // what it hands the next layer
  // Held on top while its backward runs, its parameters' gradients already there: the output's
  // gradient, temporaries, each weight gradient before it is added in.
  int64_t workspace_bytes = 0;
  // Held from a split backward's I to its W on top of the activations: the gradients the weight
  // half still needs.
  int64_t split_held_bytes = 0;
  // Whether its input has a gradient to compute (floating point): a stage whose first layer's
  // has none (tokens) has no input gradient to hurry, and its split backward is all weight half.
  bool input_differentiable = true;
  int64_t parameter_bytes = 0;  // trainable parameters; their gradients are as large
  int64_t buffer_bytes = 0;     // frozen parameters and buffers
  // Of parameter_bytes, what an earlier layer holds too (a head tied to the embedding): that
  // layer's index -> bytes. A process holding both holds them once.
  std::map<int64_t, int64_t> shared_parameter_bytes;
};

struct LayerProfile {
  int64_t rows = 0;         // the micro-batch's rows
  int64_t input_bytes = 0;  // the first layer's input
  std::vector<LayerCost> layers;
};

// Makes the optimizer that would step these parameters (the one a training run uses).
using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

// Builds layer i of `count` with `build(i)`, moves it to `device`, measures it on what the layers
// before it made of each of `samples` (the model's input at each micro-batch size to weigh; result
// [k] is samples[k]'s profile), and drops it before building the next: each layer is built once
// and the whole model is never held; a layer `build` lends (of a model built whole) is left as it
// was, its weights, buffers and device unchanged and no gradients. Each time is the fastest of
// `repeats` runs after one to warm up; bytes are counted by the allocator (StepMemoryMeter). The
// optimizer's step is timed where `optimizer` is given. Throws std::runtime_error where the
// allocator cannot be counted (another CPU allocator of higher priority is installed).
std::vector<LayerProfile> profile_layers(int64_t count,
                                         const std::function<torch::nn::AnyModule(int64_t)>& build,
                                         const std::vector<at::Tensor>& samples,
                                         const c10::Device& device, int repeats = 3,
                                         const OptimizerFactory& optimizer = {});

class Module;

// `module`'s layers profiled at every number of micro-batches (chunks) the planner weighs: each
// power of two up to 32 that divides the rows of `inputs` (one replica's batch). A model built per
// rank is built here a layer at a time, one built whole lends its layers; each converted to
// `precision` and run under its autocast as training will, and its AdamW step timed. Parameters
// two layers share (one tensor in a model built whole; a LayerSpec tie built sharing where one
// process holds both) are noted in shared_parameter_bytes.
std::map<int64_t, LayerProfile> profile_module(const Module& module, const at::Tensor& inputs,
                                               const c10::Device& device,
                                               const std::string& precision, int repeats);

}  // namespace pipetrain
