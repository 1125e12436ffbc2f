#include "fused_linear.h"

#include <torch/torch.h>

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "pipetrain/linear.h"
#include "step_weight_casts.h"
#include "util/compat.h"

namespace pipetrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Adds into `parameter`'s gradient, creating it (zeros) the first time.
at::Tensor& gradient_of(at::Tensor& parameter) {
  if (!parameter.grad().defined()) parameter.mutable_grad() = torch::zeros_like(parameter);
  return parameter.mutable_grad();
}

// `parameter`'s gradient += a @ b (a bias's as a row), in the gradient's dtype, in one GEMM that
// adds in place or, the first time, writes the gradient. Operands of a lower precision than the
// gradient (autocast's bf16) go through a GEMM with a result of the gradient's dtype where Torch
// has one, or else are widened to the gradient's dtype first: either way the product is not
// rounded to bf16, as autocast's own backward rounds it. A product of fewer rows (columns for a
// bias) than the parameter has goes into those from `first_feature` on.
void add_product(at::Tensor& parameter, const at::Tensor& a, const at::Tensor& b,
                 int64_t first_feature = 0) {
  const auto dtype = parameter.scalar_type();
  const bool bias = parameter.dim() == 1;
  const int64_t features = bias ? b.size(1) : a.size(0);
  const bool part = features != parameter.size(0);
  // The first product is written into a fresh gradient, not added to zeros; a tensor of its own
  // (optimizers detach_() gradients in place, which a view cannot be). A part's is added to zeros:
  // the other parts may never come.
  const bool first = !parameter.grad().defined() && parameter.is_contiguous() && !part;
  if (first) parameter.mutable_grad() = at::empty_like(parameter);
  at::Tensor grad = gradient_of(parameter);
  if (bias) grad = grad.unsqueeze(0);
  if (part) grad = grad.narrow(bias ? 1 : 0, first_feature, features);
  if (a.scalar_type() == dtype) {
    if (first) {
      at::mm_out(grad, a, b);
    } else {
      grad.addmm_(a, b);
    }
    return;
  }
#if PIPETRAIN_HAS_GEMM_OUT_DTYPE
  if (a.is_cuda()) {
    if (first) {
      at::mm_out(grad, a, b, dtype);
    } else {
      at::addmm_out(grad, grad, a, b, dtype);
    }
    return;
  }
#endif
  // What that GEMM computes: the operands' own values, multiplied and summed in the gradient's
  // dtype (a CPU GEMM of bf16 operands may sum in bf16).
  if (first) {
    at::mm_out(grad, a.to(dtype), b.to(dtype));
  } else {
    grad.addmm_(a.to(dtype), b.to(dtype));
  }
}

// A fused Linear's weight-gradient work: queued while `queue` defers, else accumulated now.
void hand_over(WeightGradient work, const std::shared_ptr<DeferredWeightGradients>& queue) {
  if (queue && queue->deferring()) {
    queue->add(std::move(work));
  } else {
    DeferredWeightGradients::accumulate({std::move(work)});
  }
}

// Where a fused Linear's backward leaves its weight gradients: autograd's context keeps opaque
// state as a capsule.
struct DeferralHandle : torch::CustomClassHolder {
  std::shared_ptr<DeferredWeightGradients> queue;  // null: never deferred
};

// The parameters reach the Function as plain state, not as tensor arguments: autograd then has no
// edges to them, so their gradient accumulators never run. (As inputs with no gradient returned,
// their accumulators would run empty on the stream they were created on; under CUDA graph capture
// the engine's end-of-backward wait on that stream is "a dependency on uncaptured work".)
struct LinearState {
  at::Tensor weight, bias;  // the parameters, into whose .grad the backward adds
  // What the GEMMs multiply: the parameters themselves, or under autocast their bf16 copies.
  at::Tensor compute_weight, compute_bias;
  std::shared_ptr<DeferredWeightGradients> deferred;
  bool input_is_data = false;  // the input stands in for data that needs no gradient
};

struct LinearAccumulatingGrad : torch::autograd::Function<LinearAccumulatingGrad> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input,
                            const LinearState& state) {
    ctx->save_for_backward({input});
    ctx->saved_data["weight"] = state.weight;
    ctx->saved_data["bias"] = state.bias;
    ctx->saved_data["compute_weight"] = state.compute_weight;
    auto deferral = c10::make_intrusive<DeferralHandle>();
    deferral->queue = state.deferred;
    ctx->saved_data["deferral"] = c10::IValue::make_capsule(std::move(deferral));
    ctx->saved_data["input_is_data"] = state.input_is_data;
    return at::linear(input, state.compute_weight, optional_tensor(state.compute_bias));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor input = ctx->get_saved_variables()[0];
    const at::Tensor& grad = grads[0];
    WeightGradient work{ctx->saved_data["weight"].toTensor(), ctx->saved_data["bias"].toTensor(),
                        grad.reshape({-1, grad.size(-1)}), input.reshape({-1, input.size(-1)})};
    hand_over(std::move(work),
              static_cast<DeferralHandle*>(ctx->saved_data["deferral"].toCapsule().get())->queue);
    if (ctx->saved_data["input_is_data"].toBool()) return {at::Tensor(), at::Tensor()};
    return {grad.matmul(ctx->saved_data["compute_weight"].toTensor()), at::Tensor()};
  }
};

// What pipetrain::linear does on this thread: set by FusedLinearScope.
struct Fusing {
  bool active = false;
  std::shared_ptr<DeferredWeightGradients> deferred;
};
thread_local Fusing fusing;

// The input and parameters a fused Linear's GEMMs multiply: under autocast, one bf16 copy of a
// weight per step. While a stage fuses, the step's copies (step_weight_casts.h), which carry no
// autograd history: its layers add their parameters' gradients themselves. Otherwise the casts
// autocast's linear makes, through its cache, shared with any other use of the weight: made with
// autograd recording, as autocast makes them, so that a copy another layer takes from the cache
// still carries that layer's gradient.
LinearState state_for(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                      const std::shared_ptr<DeferredWeightGradients>& deferred) {
  LinearState state{weight, bias, weight, bias, deferred};
  const auto device = input.device().type();
  if (autocast_enabled(device)) {
    const auto dtype = autocast_dtype(device);
    const auto cast = [&](const at::Tensor& parameter) {
      return fusing.active ? step_weight_cast(parameter, dtype)
                           : at::autocast::cached_cast(dtype, parameter, device);
    };
    state.compute_weight = cast(weight);
    if (bias.defined()) state.compute_bias = cast(bias);
  }
  return state;
}

at::Tensor compute_input(const at::Tensor& input) {
  const auto device = input.device().type();
  if (!autocast_enabled(device)) return input;
  return at::autocast::cached_cast(autocast_dtype(device), input, device);
}

bool needs_gradients(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias) {
  return at::GradMode::is_enabled() && (input.requires_grad() || weight.requires_grad() ||
                                        (bias.defined() && bias.requires_grad()));
}

// Autograd calls a Function's backward only through an input that carries a gradient. Data
// entering the first stage carries none: an alias of it that does stands in, and gets none back
// (nor costs the GEMM that would compute it).
at::Tensor standing_in(const at::Tensor& x) {
  return x.requires_grad() ? x : x.detach().requires_grad_(true);
}

// at::linear(input, weight, bias), its parameters' gradients accumulated in place by its backward
// (deferred into `deferred` while that defers).
at::Tensor fused_linear(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                        const std::shared_ptr<DeferredWeightGradients>& deferred) {
  if (!needs_gradients(input, weight, bias))
    return at::linear(input, weight, optional_tensor(bias));
  LinearState state = state_for(input, weight, bias, deferred);
  const at::Tensor x = compute_input(input);
  state.input_is_data = !x.requires_grad();
  return LinearAccumulatingGrad::apply(standing_in(x), state);
}

// Several fused Linear layers reading one input: the input's gradient is the sum of theirs, one
// GEMM adding into the last's result (beta 1) where autograd would add them in passes of its own.
struct LinearsHandle : torch::CustomClassHolder {
  std::vector<LinearState> states;
};

struct LinearsAccumulatingGrad : torch::autograd::Function<LinearsAccumulatingGrad> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const std::vector<LinearState>& states) {
    ctx->save_for_backward({input});
    auto handle = c10::make_intrusive<LinearsHandle>();
    handle->states = states;
    ctx->saved_data["linears"] = c10::IValue::make_capsule(std::move(handle));
    variable_list outputs;
    for (const auto& state : states) {
      outputs.push_back(
          at::linear(input, state.compute_weight, optional_tensor(state.compute_bias)));
    }
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor input = ctx->get_saved_variables()[0];
    const auto& states =
        static_cast<LinearsHandle*>(ctx->saved_data["linears"].toCapsule().get())->states;
    const at::Tensor rows = input.reshape({-1, input.size(-1)});
    at::Tensor input_grad;
    for (size_t i = 0; i < states.size(); ++i) {
      if (!grads[i].defined()) continue;  // an output the loss does not depend on
      const auto& state = states[i];
      const at::Tensor grad = grads[i].reshape({-1, grads[i].size(-1)});
      hand_over({state.weight, state.bias, grad, rows}, state.deferred);
      if (state.input_is_data) continue;
      if (input_grad.defined()) {
        input_grad.addmm_(grad, state.compute_weight);
      } else {
        input_grad = grad.mm(state.compute_weight);
      }
    }
    return {input_grad.defined() ? input_grad.view(input.sizes()) : at::Tensor(), at::Tensor()};
  }
};

// linear_parts' autograd step. Under fusion the parameters are state, as above; otherwise the
// weight and bias are inputs whose gradients autograd takes on (through autocast's cast).
struct LinearPartsHandle : torch::CustomClassHolder {
  std::optional<LinearState> fused;
  at::Tensor compute_weight;
  int64_t parts = 1;
  bool input_is_data = false;
  bool has_bias = false;
};

struct LinearParts : torch::autograd::Function<LinearParts> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                               c10::intrusive_ptr<LinearPartsHandle> handle) {
    ctx->save_for_backward({input});
    ctx->set_materialize_grads(false);  // a part the loss does not read: no gradient, no GEMMs
    handle->compute_weight = weight;
    handle->has_bias = bias.has_value();
    const int64_t parts = handle->parts;
    ctx->saved_data["handle"] = c10::IValue::make_capsule(std::move(handle));
    return at::linear(input, weight, bias).chunk(parts, -1);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor input = ctx->get_saved_variables()[0];
    const auto& handle =
        *static_cast<LinearPartsHandle*>(ctx->saved_data["handle"].toCapsule().get());
    // Autograd numbers the tensors given: an absent bias has no number.
    size_t edge = 0;
    const auto needs = [&](bool given) { return given && ctx->needs_input_grad(edge++); };
    const bool input_needs = needs(true) && !handle.input_is_data;
    const bool weight_needs = needs(true), bias_needs = needs(handle.has_bias);
    const at::Tensor rows = input.reshape({-1, input.size(-1)});
    const at::Tensor& weight = handle.compute_weight;
    const int64_t features = weight.size(0) / handle.parts;
    at::Tensor input_grad, weight_grad, bias_grad;
    // A part without a gradient (an output the loss does not read) leaves its rows at zero.
    if (weight_needs) weight_grad = at::zeros_like(weight);
    if (bias_needs) bias_grad = at::zeros({weight.size(0)}, weight.options());
    for (int64_t i = 0; i < handle.parts; ++i) {
      if (!grads[i].defined()) continue;
      const at::Tensor grad = grads[i].reshape({-1, features});
      const int64_t first = i * features;
      if (handle.fused) {
        hand_over({handle.fused->weight, handle.fused->bias, grad, rows, first},
                  handle.fused->deferred);
      }
      if (weight_needs) {
        at::Tensor rows_of_grad = weight_grad.narrow(0, first, features);
        at::mm_out(rows_of_grad, grad.t(), rows);
      }
      if (bias_needs) {
        at::Tensor columns_of_grad = bias_grad.narrow(0, first, features);
        at::sum_out(columns_of_grad, grad, 0);
      }
      if (!input_needs) continue;
      const at::Tensor rows_of_weight = weight.narrow(0, first, features);
      if (input_grad.defined()) {
        input_grad.addmm_(grad, rows_of_weight);
      } else {
        input_grad = grad.mm(rows_of_weight);
      }
    }
    if (input_grad.defined()) input_grad = input_grad.view(input.sizes());
    return {input_grad, weight_grad, bias_grad, at::Tensor()};
  }
};

// linear_after_elementwise's autograd step. Under fusion the parameters are state, as above;
// otherwise the GEMMs' weight and bias are inputs whose gradients autograd takes on (through
// autocast's cast, where they are its bf16 copies).
struct ElementwiseLinearHandle : torch::CustomClassHolder {
  RecomputedElementwise f;
  std::optional<LinearState> fused;
  at::Tensor compute_weight;
  bool inputs_are_data = false;  // a stands in for data that needs no gradient
  bool has_bias = false;
};

struct LinearAfterElementwise : torch::autograd::Function<LinearAfterElementwise> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                            const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                            c10::intrusive_ptr<ElementwiseLinearHandle> handle) {
    ctx->save_for_backward({a, b});
    handle->compute_weight = weight;
    handle->has_bias = bias.has_value();
    const at::Tensor output = at::linear(handle->f.forward(a, b), weight, bias);
    ctx->saved_data["handle"] = c10::IValue::make_capsule(std::move(handle));
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1];
    const auto& handle =
        *static_cast<ElementwiseLinearHandle*>(ctx->saved_data["handle"].toCapsule().get());
    const at::Tensor& grad = grads[0];
    const bool a_needs = ctx->needs_input_grad(0) && !handle.inputs_are_data;
    const bool b_needs = ctx->needs_input_grad(1) && !handle.inputs_are_data;
    std::array<at::Tensor, 3> elementwise;  // a's gradient, b's, f(a, b)
    if (a_needs || b_needs) {
      elementwise = handle.f.backward(grad.matmul(handle.compute_weight), a, b, a_needs, b_needs);
    } else {
      elementwise[2] = handle.f.forward(a, b);
    }
    const at::Tensor rows = grad.reshape({-1, grad.size(-1)});
    const at::Tensor input = elementwise[2].reshape({-1, elementwise[2].size(-1)});
    at::Tensor grad_weight, grad_bias;
    if (handle.fused) {
      hand_over({handle.fused->weight, handle.fused->bias, rows, input}, handle.fused->deferred);
    } else {
      if (ctx->needs_input_grad(2)) grad_weight = rows.t().mm(input);
      // An absent bias is no input: autograd numbers only the tensors given.
      if (handle.has_bias && ctx->needs_input_grad(3)) grad_bias = rows.sum(0);
    }
    return {elementwise[0], elementwise[1], grad_weight, grad_bias, at::Tensor()};
  }
};

// linear_activation_linear's autograd step. Under fusion the parameters are state, as above;
// otherwise the GEMMs' weights and biases are inputs whose gradients autograd takes on.
struct ActivationLinearsHandle : torch::CustomClassHolder {
  ActivationInGemms act;
  std::optional<LinearState> first, second;  // under fusion
  at::Tensor first_weight, second_weight;    // what the GEMMs multiply
  bool input_is_data = false;                // x stands in for data that needs no gradient
  bool first_has_bias = false, second_has_bias = false;
};

struct LinearActivationLinear : torch::autograd::Function<LinearActivationLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& first_weight,
                            const c10::optional<at::Tensor>& first_bias,
                            const at::Tensor& second_weight,
                            const c10::optional<at::Tensor>& second_bias,
                            c10::intrusive_ptr<ActivationLinearsHandle> handle) {
    const at::Tensor rows = x.reshape({-1, x.size(-1)});
    const auto [activated, pre] =
        handle->act.forward(rows, first_weight, first_bias.value_or(at::Tensor()));
    const at::Tensor output = at::linear(activated, second_weight, second_bias);
    ctx->save_for_backward({rows, pre, activated});
    handle->first_weight = first_weight;
    handle->second_weight = second_weight;
    handle->first_has_bias = first_bias.has_value();
    handle->second_has_bias = second_bias.has_value();
    ctx->saved_data["handle"] = c10::IValue::make_capsule(std::move(handle));
    auto sizes = x.sizes().vec();
    sizes.back() = output.size(-1);
    return output.view(sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &rows = saved[0], &pre = saved[1], &activated = saved[2];
    const auto& handle =
        *static_cast<ActivationLinearsHandle*>(ctx->saved_data["handle"].toCapsule().get());
    const at::Tensor grad = grads[0].reshape({-1, grads[0].size(-1)});
    const at::Tensor grad_pre = handle.act.backward(grad, handle.second_weight, pre);
    // Autograd numbers the tensors given: an absent bias has no number.
    size_t edge = 0;
    const auto needs = [&](bool given) { return given && ctx->needs_input_grad(edge++); };
    const bool x_needs = needs(true) && !handle.input_is_data;
    const bool first_weight_needs = needs(true), first_bias_needs = needs(handle.first_has_bias);
    const bool second_weight_needs = needs(true), second_bias_needs = needs(handle.second_has_bias);
    variable_list out(6);
    if (handle.first) {
      hand_over({handle.second->weight, handle.second->bias, grad, activated},
                handle.second->deferred);
      hand_over({handle.first->weight, handle.first->bias, grad_pre, rows}, handle.first->deferred);
    } else {
      if (first_weight_needs) out[1] = grad_pre.t().mm(rows);
      if (first_bias_needs) out[2] = grad_pre.sum(0);
      if (second_weight_needs) out[3] = grad.t().mm(activated);
      if (second_bias_needs) out[4] = grad.sum(0);
    }
    if (x_needs) {
      auto sizes = grads[0].sizes().vec();
      sizes.back() = rows.size(-1);
      out[0] = grad_pre.mm(handle.first_weight).view(sizes);
    }
    return out;
  }
};

class AccumulatingLinearImpl : public torch::nn::Cloneable<AccumulatingLinearImpl> {
 public:
  AccumulatingLinearImpl(const torch::nn::Linear& linear,
                         std::shared_ptr<DeferredWeightGradients> deferred)
      : linear_(linear), deferred_(std::move(deferred)) {
    reset();
  }
  void reset() override {
    weight = register_parameter("weight", linear_->weight);
    if (linear_->bias.defined()) bias = register_parameter("bias", linear_->bias);
  }
  at::Tensor forward(const at::Tensor& input) {
    return fused_linear(input, weight, bias, deferred_);
  }
  at::Tensor weight, bias;

 private:
  torch::nn::Linear linear_;
  std::shared_ptr<DeferredWeightGradients> deferred_;
};
TORCH_MODULE(AccumulatingLinear);

}  // namespace

at::Tensor linear(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias) {
  if (!fusing.active) return at::linear(input, weight, optional_tensor(bias));
  return fused_linear(input, weight, bias, fusing.deferred);
}

std::vector<at::Tensor> linears(const at::Tensor& input, const std::vector<at::Tensor>& weights,
                                const std::vector<at::Tensor>& biases) {
  if (!biases.empty() && biases.size() != weights.size()) {
    throw std::invalid_argument("pipetrain::linears: " + std::to_string(weights.size()) +
                                " weights and " + std::to_string(biases.size()) +
                                " biases; give one bias per weight (undefined: none) or none");
  }
  const auto bias = [&](size_t i) { return biases.empty() ? at::Tensor() : biases[i]; };
  bool fuse = fusing.active;
  for (size_t i = 0; i < weights.size() && fuse; ++i) {
    fuse = needs_gradients(input, weights[i], bias(i));
  }
  if (!fuse) {
    std::vector<at::Tensor> outputs;
    for (size_t i = 0; i < weights.size(); ++i)
      outputs.push_back(linear(input, weights[i], bias(i)));
    return outputs;
  }
  const at::Tensor x = compute_input(input);
  std::vector<LinearState> states;
  for (size_t i = 0; i < weights.size(); ++i) {
    states.push_back(state_for(input, weights[i], bias(i), fusing.deferred));
    states.back().input_is_data = !x.requires_grad();
  }
  return LinearsAccumulatingGrad::apply(standing_in(x), states);
}

at::Tensor linear_after_elementwise(const RecomputedElementwise& f, const at::Tensor& a,
                                    const at::Tensor& b, const at::Tensor& weight,
                                    const at::Tensor& bias) {
  if (!needs_gradients(a, weight, bias) && !(at::GradMode::is_enabled() && b.requires_grad())) {
    return pipetrain::linear(f.forward(a, b), weight, bias);
  }
  auto handle = c10::make_intrusive<ElementwiseLinearHandle>();
  handle->f = f;
  LinearState state = state_for(a, weight, bias, fusing.deferred);
  at::Tensor compute_weight = state.compute_weight, compute_bias = state.compute_bias;
  if (fusing.active) {
    handle->fused = std::move(state);
    // The parameters are no inputs then: an input must carry a gradient for the backward to run.
    handle->inputs_are_data = !a.requires_grad() && !b.requires_grad();
    return LinearAfterElementwise::apply(
        standing_in(a), b, compute_weight.detach(),
        optional_tensor(compute_bias.defined() ? compute_bias.detach() : compute_bias),
        std::move(handle));
  }
  // An undefined tensor is no autograd input in every Torch: an absent bias goes as nullopt.
  return LinearAfterElementwise::apply(a, b, compute_weight, optional_tensor(compute_bias),
                                       std::move(handle));
}

std::vector<at::Tensor> linear_parts(const at::Tensor& input, const at::Tensor& weight,
                                     const at::Tensor& bias, int64_t parts) {
  if (parts < 1 || weight.size(0) % parts != 0) {
    throw std::invalid_argument("pipetrain::linear_parts: " + std::to_string(weight.size(0)) +
                                " output features do not split into " + std::to_string(parts) +
                                " equal parts");
  }
  if (!needs_gradients(input, weight, bias)) {
    return pipetrain::linear(input, weight, bias).chunk(parts, -1);
  }
  LinearState state = state_for(input, weight, bias, fusing.deferred);
  const at::Tensor x = compute_input(input);
  auto handle = c10::make_intrusive<LinearPartsHandle>();
  handle->parts = parts;
  const at::Tensor compute_weight = state.compute_weight, compute_bias = state.compute_bias;
  if (fusing.active) {
    handle->input_is_data = !x.requires_grad();
    handle->fused = std::move(state);
    return LinearParts::apply(
        standing_in(x), compute_weight.detach(),
        optional_tensor(compute_bias.defined() ? compute_bias.detach() : compute_bias),
        std::move(handle));
  }
  return LinearParts::apply(x, compute_weight, optional_tensor(compute_bias), std::move(handle));
}

at::Tensor linear_activation_linear(const ActivationInGemms& act, const at::Tensor& x,
                                    const at::Tensor& first_weight, const at::Tensor& first_bias,
                                    const at::Tensor& second_weight,
                                    const at::Tensor& second_bias) {
  const LinearState first = state_for(x, first_weight, first_bias, fusing.deferred);
  const LinearState second = state_for(x, second_weight, second_bias, fusing.deferred);
  const at::Tensor input = compute_input(x);
  if (!needs_gradients(x, first_weight, first_bias) &&
      !needs_gradients(x, second_weight, second_bias)) {
    const at::Tensor rows = input.reshape({-1, input.size(-1)});
    const at::Tensor activated = act.forward(rows, first.compute_weight, first.compute_bias)[0];
    auto sizes = x.sizes().vec();
    sizes.back() = second_weight.size(0);
    return at::linear(activated, second.compute_weight, optional_tensor(second.compute_bias))
        .view(sizes);
  }
  auto handle = c10::make_intrusive<ActivationLinearsHandle>();
  handle->act = act;
  // An undefined tensor is no autograd input in every Torch: an absent bias goes as nullopt.
  const auto bias = [&](const at::Tensor& b) { return optional_tensor(b); };
  if (fusing.active) {
    // The parameters are no inputs then: x must carry a gradient for the backward to run.
    handle->input_is_data = !input.requires_grad();
    handle->first = first;
    handle->second = second;
    const auto detached = [](const at::Tensor& t) { return t.defined() ? t.detach() : t; };
    return LinearActivationLinear::apply(
        standing_in(input), first.compute_weight.detach(), bias(detached(first.compute_bias)),
        second.compute_weight.detach(), bias(detached(second.compute_bias)), std::move(handle));
  }
  return LinearActivationLinear::apply(input, first.compute_weight, bias(first.compute_bias),
                                       second.compute_weight, bias(second.compute_bias),
                                       std::move(handle));
}

FusedLinearScope::FusedLinearScope(std::shared_ptr<DeferredWeightGradients> deferred)
    : was_fusing_(fusing.active), previous_(std::exchange(fusing.deferred, std::move(deferred))) {
  fusing.active = true;
}

FusedLinearScope::~FusedLinearScope() {
  fusing.active = was_fusing_;
  fusing.deferred = std::move(previous_);
}

DeferredWeightGradients::Deferral::Deferral(DeferredWeightGradients* queue) : queue_(queue) {
  if (queue_) queue_->deferring_ = true;
}

DeferredWeightGradients::Deferral::~Deferral() {
  if (queue_) queue_->deferring_ = false;
}

std::vector<WeightGradient> DeferredWeightGradients::take() { return std::exchange(pending_, {}); }

void DeferredWeightGradients::accumulate(std::vector<WeightGradient> work) {
  torch::NoGradGuard no_grad;  // may be called where autograd records
  // Pieces by layer, layers in the order they first appear. A layer is its (weight, bias) pair:
  // two layers may share a weight and not a bias.
  std::vector<std::vector<WeightGradient*>> layers;
  std::map<std::tuple<c10::TensorImpl*, c10::TensorImpl*, int64_t>, size_t> layer_of;
  for (auto& piece : work) {
    const auto key = std::make_tuple(
        piece.weight.unsafeGetTensorImpl(),
        piece.bias.defined() ? piece.bias.unsafeGetTensorImpl() : nullptr, piece.first_feature);
    const auto [it, added] = layer_of.emplace(key, layers.size());
    if (added) layers.emplace_back();
    layers[it->second].push_back(&piece);
  }
  for (auto& pieces : layers) {
    at::Tensor weight = pieces[0]->weight;
    at::Tensor bias = pieces[0]->bias;
    const bool bias_needs_grad = bias.defined() && bias.requires_grad();
    const int64_t first_feature = pieces[0]->first_feature;
    const auto add = [&](const at::Tensor& grad_output, const at::Tensor& input) {
      if (weight.requires_grad()) add_product(weight, grad_output.t(), input, first_feature);
      if (bias_needs_grad) {
        // A column sum as a GEMM of one row: over a micro-batch's few rows ATen's sum is slow.
        add_product(bias, at::ones({1, grad_output.size(0)}, grad_output.options()), grad_output,
                    first_feature);
      }
    };
    int64_t rows = 0;
    for (const auto* piece : pieces) rows += piece->grad_output.size(0);
    if (!weight.requires_grad() && !bias_needs_grad) {
      // nothing to accumulate (a frozen layer)
    } else if (pieces.size() == 1 || rows >= kJoinedRows * static_cast<int64_t>(pieces.size())) {
      for (const auto* piece : pieces) add(piece->grad_output, piece->input);
    } else {
      std::vector<at::Tensor> grad_outputs, inputs;
      for (const auto* piece : pieces) {
        grad_outputs.push_back(piece->grad_output);
        inputs.push_back(piece->input);
      }
      add(at::cat(grad_outputs), at::cat(inputs));
    }
    for (auto* piece : pieces) *piece = {};  // this layer's activations may go now
  }
}

torch::nn::AnyModule fuse_gradient_accumulation(const torch::nn::AnyModule& layer,
                                                std::shared_ptr<DeferredWeightGradients> deferred) {
  auto module = layer.ptr();
  if (auto linear = std::dynamic_pointer_cast<torch::nn::LinearImpl>(module)) {
    return torch::nn::AnyModule(AccumulatingLinear(torch::nn::Linear(linear), std::move(deferred)));
  }
  return layer;
}

}  // namespace pipetrain
