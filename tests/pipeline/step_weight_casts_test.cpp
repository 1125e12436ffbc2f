// Under autocast, a step of fused Linear layers multiplies bf16 copies of the weights made once
// for the step, several in one copy: each exactly autocast's cast of the weight as it is when the
// step begins, however the weights changed between steps (an optimizer's in-place update, a write
// through .data() that leaves no trace in the version counter, a weight freed and another made),
// and never one from an earlier step.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "ops/fused_linear.h"  // internal: FusedLinearScope
#include "ops/step_weight_casts.h"
#include "pipetrain/linear.h"
#include "support/devices.h"
#include "util/compat.h"

namespace pipetrain::testing::step_weight_casts_test {
namespace {

// Autocast to bf16 on `device` while alive.
struct Bf16Autocast {
  explicit Bf16Autocast(c10::Device device) : device(device) {
    set_autocast_to_bf16(device.type(), true);
  }
  ~Bf16Autocast() {
    set_autocast_to_bf16(device.type(), false);
    at::autocast::clear_cache();
  }
  c10::Device device;
};

// Two fused layers, x -> first -> second, over several steps: every step's outputs are those of
// bf16 GEMMs of the weights as they are at that step, bit for bit (same operands, same kernels).
void expect_each_step_reads_its_weights(c10::Device device) {
  torch::manual_seed(3);
  const auto options = torch::TensorOptions().device(device);
  const auto x = torch::randn({8, 16}, options);
  auto first = torch::randn({24, 16}, options.requires_grad(true));
  const auto bias = torch::randn({24}, options.requires_grad(true));
  const auto second = torch::randn({4, 24}, options.requires_grad(true));
  const Bf16Autocast autocast(device);
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    at::Tensor hidden, out;
    {
      FusedLinearScope fusing(nullptr);
      for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
        hidden = pipetrain::linear(x, first, bias);
        out = pipetrain::linear(hidden, second);
      }
      out.sum().backward();
    }
    at::Tensor expected_hidden, expected_out;
    {
      const torch::NoGradGuard no_grad;
      const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
      expected_hidden =
          at::linear(x.to(at::kBFloat16), first.to(at::kBFloat16), bias.to(at::kBFloat16));
      expected_out = at::linear(expected_hidden, second.to(at::kBFloat16));
    }
    EXPECT_TRUE(torch::equal(hidden, expected_hidden));
    EXPECT_TRUE(torch::equal(out, expected_out));
    // Between steps, the weights change as users change them.
    const torch::NoGradGuard no_grad;
    if (step == 0) {
      first.add_(first.grad(), -0.1);  // an optimizer's update: the version counter moves
      second.add_(second.grad(), -0.1);
    } else if (step == 1) {
      first.data().mul_(0.5);  // through .data(): the version counter stays
      bias.data().add_(1.0);
    } else if (step == 2) {
      // Another weight in the first's place (maybe at its address).
      first = torch::randn({24, 16}, options.requires_grad(true));
    }
  }
}

PIPETRAIN_TEST_ON_CPU_AND_CUDA(StepWeightCasts, EachStepMultipliesTheWeightsAsTheyAreThen,
                               expect_each_step_reads_its_weights)

// After a first step, the weights it asked for are copied together at the next step's first use,
// into one buffer; inside a step each is copied once; outside a step, or with autocast's cache off
// (a CUDA graph's capture), the cast is autocast's own, with its autograd history; a weight no
// longer asked for drops out after a step.
TEST(StepWeightCasts, AStepCopiesThePreviousStepsWeightsTogetherOnce) {
  torch::manual_seed(4);
  const auto a = torch::randn({6, 5}, torch::requires_grad());
  const auto b = torch::randn({7}, torch::requires_grad());
  const Bf16Autocast autocast(c10::Device(c10::DeviceType::CPU));
  {
    const StepWeightCastScope step;
    EXPECT_NE(step_weight_cast(a, at::kBFloat16).data_ptr(),
              step_weight_cast(b, at::kBFloat16).data_ptr());
  }
  {
    const StepWeightCastScope step;
    const auto a16 = step_weight_cast(a, at::kBFloat16);
    const auto b16 = step_weight_cast(b, at::kBFloat16);
    EXPECT_TRUE(a16.storage().is_alias_of(b16.storage()));
    EXPECT_EQ(step_weight_cast(a, at::kBFloat16).data_ptr(), a16.data_ptr());
    EXPECT_TRUE(torch::equal(a16, a.detach().to(at::kBFloat16)));
    EXPECT_TRUE(torch::equal(b16, b.detach().to(at::kBFloat16)));
    EXPECT_EQ(a16.grad_fn(), nullptr);
    {
      const bool cache_was = at::autocast::is_autocast_cache_enabled();
      at::autocast::set_autocast_cache_enabled(false);
      EXPECT_NE(step_weight_cast(a, at::kBFloat16).grad_fn(), nullptr);
      at::autocast::set_autocast_cache_enabled(cache_was);
    }
  }
  EXPECT_NE(step_weight_cast(a, at::kBFloat16).grad_fn(), nullptr);
  // A weight the step before did not ask for is not copied ahead: b, asked for two steps ago, is
  // copied beside a one step on (in a buffer of both), not two.
  const int64_t both_bytes = 2 * 32 * 2;  // each copy padded to 32 bf16 elements
  for (const int64_t bytes : {both_bytes, both_bytes / 2}) {
    const StepWeightCastScope step;
    EXPECT_EQ(step_weight_cast(a, at::kBFloat16).storage().nbytes(), bytes);
  }
}

}  // namespace
}  // namespace pipetrain::testing::step_weight_casts_test
