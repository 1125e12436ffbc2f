// AdamW whose step on CUDA is one fused kernel per parameter dtype (at::_fused_adamw_, Torch 2.x)
// instead of LibTorch's loop of about ten kernels per parameter: for GPT-2 124M on one H200 the
// loop takes 13 ms of a 65 ms step. The arithmetic, the options (per parameter group) and the
// state (torch::optim::AdamWParamState, so checkpoints and optimizer_state.h see an AdamW) are
// AdamW's; parameters on the CPU, amsgrad, or a Torch without the kernel (Debian's 1.13) take
// AdamW's own step.
#pragma once

#include <torch/optim/adamw.h>

#include <ATen/core/Tensor.h>

#include <map>
#include <utility>

namespace pipetrain {

class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  at::Tensor step(LossClosure closure = nullptr) override;

  // The next step divides every gradient by `divisor` (a scalar tensor) first, leaving the
  // quotients in .grad, as if each had been divided in place before it: on the fused path the
  // kernel divides as it reads them (its grad_scale), so clipping by norm costs no pass of its own
  // over the gradients.
  void divide_gradients_in_next_step(at::Tensor divisor) { divisor_ = std::move(divisor); }

 private:
  // Each parameter's step count as the kernel reads it (a float tensor on its device), with the
  // host count it was made for: state loaded from a checkpoint replaces the host count.
  std::map<const void*, std::pair<at::Tensor, int64_t>> device_steps_;
  at::Tensor divisor_;
};

// Divides every gradient `optimizer` steps by `divisor` (a scalar tensor) before its next step, as
// clipping by norm does: a FusedAdamW divides them as its kernel reads them, no pass of their own;
// any other optimizer's are divided in place now.
void divide_gradients_before_step(torch::optim::Optimizer& optimizer, const at::Tensor& divisor);

}  // namespace pipetrain
