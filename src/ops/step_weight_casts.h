// The bf16 copies of the weights that fused Linear layers multiply under autocast, made for a
// whole step at once.
//
// Autocast casts a weight on its first use in a step, through its cache: for GPT-2 124M ~100
// small cast kernels, each one a trip through the dispatcher and autograd on the host, while the
// GPU waits for the host between them. Here the first weight a step misses brings every weight
// the previous step used on this device into one buffer, in one multi-tensor copy; later uses in
// the step, in every micro-batch, read those copies.
//
// A step is the outermost StepWeightCastScope (FusedLinearScope holds one; a pipe opens that
// around each step of a stage): its copies are made at its first miss, from the weights as they
// are then (nothing in a pipe's step changes a weight: the optimizer steps outside), and go at
// its end, on the thread that made them, as autocast's would go at the end of the step; nothing
// is kept between steps but which weights were asked for. Weights stay as they were in nested
// scopes. The copies carry no autograd history: only fused Linear layers read them, which add
// their weights' gradients themselves. Where autocast's cache is off (while a stage's CUDA graphs
// are captured: each replay must cast inside the graph) the cast is autocast's own.
#pragma once

#include <ATen/core/Tensor.h>

namespace pipetrain {

// `weight` in `dtype`, made once in the current step (see above).
at::Tensor step_weight_cast(const at::Tensor& weight, at::ScalarType dtype);

// While alive (nested: the outermost), one step: the copies made inside it go at its end.
class StepWeightCastScope {
 public:
  StepWeightCastScope();
  ~StepWeightCastScope();
  StepWeightCastScope(const StepWeightCastScope&) = delete;
  StepWeightCastScope& operator=(const StepWeightCastScope&) = delete;
};

}  // namespace pipetrain
