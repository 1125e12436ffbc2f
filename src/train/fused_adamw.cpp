#include "pipetrain/fused_adamw.h"

#include <torch/torch.h>

#include <map>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

namespace pipetrain {

namespace {

// Each gradient divided by `divisor`, in place: what the fused kernel does as it reads them. One
// kernel per gradient dtype where Torch has a foreach division by a tensor.
void divide_gradients(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                      const at::Tensor& divisor) {
  torch::NoGradGuard no_grad;
  std::map<std::tuple<int, int, at::ScalarType>, std::vector<at::Tensor>> gradients;
  for (const auto& group : groups) {
    for (const auto& parameter : group.params()) {
      const at::Tensor& grad = parameter.grad();
      if (!grad.defined()) continue;
      gradients[{static_cast<int>(grad.device().type()), grad.device().index(), grad.scalar_type()}]
          .push_back(grad);
    }
  }
  for (auto& entry : gradients) {
    auto& group = entry.second;
    const auto by = divisor.to(group.front().device(), group.front().scalar_type());
#if TORCH_VERSION_MAJOR >= 2
    at::_foreach_div_(group, by);
#else
    for (auto& grad : group) grad.div_(by);
#endif
  }
}

}  // namespace

at::Tensor FusedAdamW::step(LossClosure closure) {
  const at::Tensor divisor = std::exchange(divisor_, at::Tensor());
#if TORCH_VERSION_MAJOR >= 2
  bool fusable = true;
  for (const auto& group : param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    for (const auto& parameter : group.params()) fusable &= parameter.is_cuda();
    fusable &= !options.amsgrad();
  }
  if (!fusable) {
    if (divisor.defined()) divide_gradients(param_groups(), divisor);
    return AdamW::step(std::move(closure));
  }
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    // One kernel per (device, dtype), as torch.optim groups its tensors.
    struct Lists {
      std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
    };
    std::map<std::pair<int64_t, at::ScalarType>, Lists> lists;
    for (auto& parameter : group.params()) {
      if (!parameter.grad().defined()) continue;
      // Torch 2.x keys the state by the parameter's TensorImpl itself.
      void* const key = parameter.unsafeGetTensorImpl();
      auto& slot = state_[key];
      if (!slot) {
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(parameter, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(parameter, at::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*slot);
      auto& [device_step, host_step] = device_steps_[key];
      if (!device_step.defined() || host_step != state.step()) {
        device_step = torch::full({}, static_cast<double>(state.step()),
                                  parameter.options().dtype(torch::kFloat32));
      }
      state.step(state.step() + 1);
      host_step = state.step();
      auto& list = lists[{parameter.get_device(), parameter.scalar_type()}];
      list.params.push_back(parameter);
      list.grads.push_back(parameter.grad());
      list.exp_avgs.push_back(state.exp_avg());
      list.exp_avg_sqs.push_back(state.exp_avg_sq());
      list.steps.push_back(device_step);
    }
    for (auto& [where, list] : lists) {
      at::_foreach_add_(list.steps, 1);
      // The kernel reads its divisor as a float on the parameters' device.
      std::optional<at::Tensor> grad_scale;
      if (divisor.defined()) grad_scale = divisor.to(list.params[0].device(), at::kFloat);
      at::_fused_adamw_(list.params, list.grads, list.exp_avgs, list.exp_avg_sqs, {}, list.steps,
                        options.lr(), std::get<0>(options.betas()), std::get<1>(options.betas()),
                        options.weight_decay(), options.eps(), /*amsgrad=*/false,
                        /*maximize=*/false, grad_scale, /*found_inf=*/std::nullopt);
    }
  }
  return loss;
#else
  if (divisor.defined()) divide_gradients(param_groups(), divisor);
  return AdamW::step(std::move(closure));
#endif
}

void divide_gradients_before_step(torch::optim::Optimizer& optimizer, const at::Tensor& divisor) {
  if (auto* fused = dynamic_cast<FusedAdamW*>(&optimizer)) {
    fused->divide_gradients_in_next_step(divisor);
  } else {
    divide_gradients(optimizer.param_groups(), divisor);
  }
}

}  // namespace pipetrain
