// Linear layers whose weight gradient is accumulated inside the GEMM that computes it, as
// Megatron's gradient-accumulation fusion does. With micro-batches every backward of a Linear
// computes its weight gradient into a new tensor and then adds it to .grad: a second pass over a
// buffer as large as the weight, per micro-batch. Here backward runs `grad.addmm_(g^T, x)`, so the
// GEMM's epilogue does the accumulation (in fp32 inside cuBLAS, rounded once into .grad), and the
// bias's gradient is one `addmv_` (a sum over rows followed by an add is two kernels, and the sum
// over the short columns of a micro-batch is slow). Under autocast the GEMMs run in bf16 and,
// where Torch has GEMMs with an fp32 result, write the fp32 gradient directly: no bf16 gradient,
// no cast of it, no separate column sum for the bias.
//
// A stage can also put those weight-gradient GEMMs off: until it has sent its input's gradient to
// the previous stage (the B/W split of zero-bubble pipelines: the previous stage then waits for
// the input-gradient half of the backward alone), or until its last backward of the step, where
// each layer's micro-batches join into one GEMM (a micro-batch's GEMM is short in the summed
// dimension, and each one reads and writes the whole weight gradient).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

#include <array>
#include <functional>
#include <memory>
#include <vector>

#include "step_weight_casts.h"

namespace pipetrain {

// The weight-gradient work of one fused Linear for one micro-batch.
struct WeightGradient {
  at::Tensor weight, bias;        // the parameters (bias undefined if the layer has none)
  at::Tensor grad_output, input;  // rows x out_features, rows x in_features, in the GEMM's dtype
  // The first of the weight's (and bias's) output features grad_output's columns are: a part of a
  // layer (linear_parts) covers some of them.
  int64_t first_feature = 0;
};

// Weight-gradient work the fused Linear layers of one stage left for later. While a Deferral is
// alive their backwards compute only their input's gradient and queue the rest here.
class DeferredWeightGradients {
 public:
  class Deferral {
   public:
    explicit Deferral(DeferredWeightGradients* queue);  // null: defers nothing
    ~Deferral();
    Deferral(const Deferral&) = delete;
    Deferral& operator=(const Deferral&) = delete;

   private:
    DeferredWeightGradients* queue_;
  };

  bool deferring() const { return deferring_; }
  void add(WeightGradient work) { pending_.push_back(std::move(work)); }
  // Accumulates what is queued (see accumulate) and empties the queue.
  void run() { accumulate(take()); }
  // Empties the queue, handing its work over (to run later, or, under CUDA graphs, to keep its
  // tensors alive at their captured addresses).
  std::vector<WeightGradient> take();
  // Drops what is queued without running it (left by a step that failed half-way).
  void clear() { pending_.clear(); }

  // Adds `work`'s gradients into the parameters' .grad (created as zeros if undefined), layers in
  // the order they first appear: one GEMM per layer, its micro-batches' rows joined, where they
  // average fewer than kJoinedRows rows; else one GEMM per micro-batch, each adding in place
  // (joining copies every row, which costs more than long GEMMs gain: Llama 150M on an H200, 2
  // micro-batches of 8192 rows, 2.7 ms of copies in a 32 ms step). Each layer's tensors are let
  // go once its GEMMs are issued.
  static void accumulate(std::vector<WeightGradient> work);
  static constexpr int64_t kJoinedRows = 2048;

 private:
  bool deferring_ = false;
  std::vector<WeightGradient> pending_;
};

// While alive, pipetrain::linear (pipetrain/linear.h) on this thread fuses, as the Linear layers
// fuse_gradient_accumulation swaps in do, deferring into `deferred` (if given) while it defers.
// A pipe sets one around each step of a stage that fuses: under autocast the step's fused layers
// multiply weights cast once for the step (step_weight_casts.h).
class FusedLinearScope {
 public:
  explicit FusedLinearScope(std::shared_ptr<DeferredWeightGradients> deferred);
  ~FusedLinearScope();
  FusedLinearScope(const FusedLinearScope&) = delete;
  FusedLinearScope& operator=(const FusedLinearScope&) = delete;

 private:
  bool was_fusing_;
  std::shared_ptr<DeferredWeightGradients> previous_;
  StepWeightCastScope step_casts_;
};

// An elementwise step f(a, b) whose backward reads a and b, such as SwiGLU's silu(gate) * up.
struct RecomputedElementwise {
  std::function<at::Tensor(const at::Tensor& a, const at::Tensor& b)> forward;
  // From the gradient of f(a, b): {a's gradient, b's gradient, f(a, b) again}, each gradient
  // undefined where not asked for.
  std::function<std::array<at::Tensor, 3>(const at::Tensor& grad, const at::Tensor& a,
                                          const at::Tensor& b, bool a_needs, bool b_needs)>
      backward;
};

// pipetrain::linear(f.forward(a, b), weight, bias), f(a, b) let go once the GEMM has read it:
// autograd would keep it for the weight's gradient (for SwiGLU, a third of the MLP's activations
// and as large as a or b), where here f's backward makes it again in the pass that reads a and b
// anyway. Fuses gradient accumulation where pipetrain::linear does.
at::Tensor linear_after_elementwise(const RecomputedElementwise& f, const at::Tensor& a,
                                    const at::Tensor& b, const at::Tensor& weight,
                                    const at::Tensor& bias = at::Tensor());

// An activation the GEMMs around it apply themselves (GPT-2's GELU, in cuBLASLt's epilogues).
struct ActivationInGemms {
  // {act(pre), pre} with pre = x weight^T + bias: x [rows, in], weight [out, in], bias [out] or
  // undefined.
  std::function<std::array<at::Tensor, 2>(const at::Tensor& x, const at::Tensor& weight,
                                          const at::Tensor& bias)>
      forward;
  // (grad weight) * act'(pre): grad [rows, out], the next Linear's weight [out, hidden], pre
  // [rows, hidden].
  std::function<at::Tensor(const at::Tensor& grad, const at::Tensor& weight, const at::Tensor& pre)>
      backward;
};

// pipetrain::linear(act(pipetrain::linear(x, first_weight, first_bias)), second_weight,
// second_bias), `act` applied by the GEMMs around it: no pass of its own over the hidden
// activations, forward or backward. Keeps x, pre and act(pre), as autograd would. Fuses gradient
// accumulation where pipetrain::linear does.
at::Tensor linear_activation_linear(const ActivationInGemms& act, const at::Tensor& x,
                                    const at::Tensor& first_weight, const at::Tensor& first_bias,
                                    const at::Tensor& second_weight, const at::Tensor& second_bias);

// pipetrain::linear(input, weight, bias).chunk(parts, -1), each part's gradient multiplied by its
// own rows of the weight in the backward, where autograd would first copy the parts' gradients
// into one (GPT-2's c_attn: q, k and v from one weight, whose gradients attention gives apart).
// Fuses gradient accumulation where pipetrain::linear does.
std::vector<at::Tensor> linear_parts(const at::Tensor& input, const at::Tensor& weight,
                                     const at::Tensor& bias, int64_t parts);

// `layer` itself, or, for a torch::nn::Linear, a module sharing its parameters whose backward
// accumulates their gradients in place, outside autograd (whose graph has no edges to them),
// deferring that work into `deferred` (if given) while it defers.
torch::nn::AnyModule fuse_gradient_accumulation(
    const torch::nn::AnyModule& layer, std::shared_ptr<DeferredWeightGradients> deferred = nullptr);

}  // namespace pipetrain
