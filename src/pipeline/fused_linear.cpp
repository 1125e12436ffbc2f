#include "fused_linear.h"

#include <torch/torch.h>

#include <map>
#include <utility>

#include "pipetrain/compat.h"

namespace pipetrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Adds into `parameter`'s gradient, creating it (zeros) the first time.
at::Tensor& gradient_of(at::Tensor& parameter) {
  if (!parameter.grad().defined()) parameter.mutable_grad() = torch::zeros_like(parameter);
  return parameter.mutable_grad();
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
  at::Tensor weight, bias;
  c10::intrusive_ptr<DeferralHandle> deferral;
  bool input_is_data = false;  // the input stands in for data that needs no gradient
};

struct LinearAccumulatingGrad : torch::autograd::Function<LinearAccumulatingGrad> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input,
                            const LinearState& state) {
    ctx->save_for_backward({input});
    ctx->saved_data["weight"] = state.weight;
    ctx->saved_data["bias"] = state.bias;
    ctx->saved_data["deferral"] = c10::IValue::make_capsule(state.deferral);
    ctx->saved_data["input_is_data"] = state.input_is_data;
    return at::linear(
        input, state.weight,
        state.bias.defined() ? c10::optional<at::Tensor>(state.bias) : c10::optional<at::Tensor>());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor input = ctx->get_saved_variables()[0];
    at::Tensor weight = ctx->saved_data["weight"].toTensor();
    at::Tensor bias = ctx->saved_data["bias"].toTensor();
    const at::Tensor& grad = grads[0];
    WeightGradient work{weight, bias, grad.reshape({-1, grad.size(-1)}),
                        input.reshape({-1, input.size(-1)})};
    const auto& queue =
        static_cast<DeferralHandle*>(ctx->saved_data["deferral"].toCapsule().get())->queue;
    if (queue && queue->deferring()) {
      queue->add(std::move(work));
    } else {
      DeferredWeightGradients::accumulate({std::move(work)});
    }
    if (ctx->saved_data["input_is_data"].toBool()) return {at::Tensor(), at::Tensor()};
    return {grad.matmul(weight), at::Tensor()};
  }
};

class AccumulatingLinearImpl : public torch::nn::Cloneable<AccumulatingLinearImpl> {
 public:
  AccumulatingLinearImpl(const torch::nn::Linear& linear,
                         std::shared_ptr<DeferredWeightGradients> deferred)
      : linear_(linear), deferral_(c10::make_intrusive<DeferralHandle>()) {
    deferral_->queue = std::move(deferred);
    reset();
  }
  void reset() override {
    weight = register_parameter("weight", linear_->weight);
    if (linear_->bias.defined()) bias = register_parameter("bias", linear_->bias);
  }
  at::Tensor forward(const at::Tensor& input) {
    // Under autocast the GEMM runs in bf16 while the gradients are fp32, which addmm_ cannot mix.
    if (!at::GradMode::is_enabled() || autocast_enabled(input.device().type()) ||
        !(input.requires_grad() || weight.requires_grad() ||
          (bias.defined() && bias.requires_grad()))) {
      return linear_->forward(input);
    }
    // Autograd calls a Function's backward only through an input that carries a gradient. Data
    // entering the first stage carries none: an alias of it that does stands in, and gets none
    // back (nor costs the GEMM that would compute it).
    const bool input_is_data = !input.requires_grad();
    return LinearAccumulatingGrad::apply(
        input_is_data ? input.detach().requires_grad_(true) : input,
        LinearState{weight, bias, deferral_, input_is_data});
  }
  at::Tensor weight, bias;

 private:
  torch::nn::Linear linear_;
  c10::intrusive_ptr<DeferralHandle> deferral_;
};
TORCH_MODULE(AccumulatingLinear);

}  // namespace

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
  std::map<std::pair<c10::TensorImpl*, c10::TensorImpl*>, size_t> layer_of;
  for (auto& piece : work) {
    const auto key =
        std::make_pair(piece.weight.unsafeGetTensorImpl(),
                       piece.bias.defined() ? piece.bias.unsafeGetTensorImpl() : nullptr);
    const auto [it, added] = layer_of.emplace(key, layers.size());
    if (added) layers.emplace_back();
    layers[it->second].push_back(&piece);
  }
  for (auto& pieces : layers) {
    at::Tensor weight = pieces[0]->weight;
    at::Tensor bias = pieces[0]->bias;
    const bool bias_needs_grad = bias.defined() && bias.requires_grad();
    if (weight.requires_grad() || bias_needs_grad) {
      auto rows = [&](at::Tensor WeightGradient::*member) {
        if (pieces.size() == 1) return pieces[0]->*member;
        std::vector<at::Tensor> parts;
        for (const auto* piece : pieces) parts.push_back(piece->*member);
        return at::cat(parts);
      };
      const at::Tensor grad_output = rows(&WeightGradient::grad_output);
      if (weight.requires_grad()) {
        gradient_of(weight).addmm_(grad_output.t(), rows(&WeightGradient::input));
      }
      if (bias_needs_grad) {
        gradient_of(bias).addmv_(grad_output.t(),
                                 at::ones({grad_output.size(0)}, grad_output.options()));
      }
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
