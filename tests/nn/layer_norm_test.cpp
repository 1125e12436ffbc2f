// pipetrain::layer_norm is at::layer_norm over the last dimension: on a GPU (pipetrain's kernels
// in a build with nvcc, ATen's otherwise) the same output and gradients within fp32 summation
// order (relative 1e-5, absolute 1e-5), for rows and columns that fill the kernels' blocks, ones
// that do not, a width whose weight gradient the input gradient's pass cannot sum (1280: a pass of
// its own) and a width the row kernels do not take (33), with and without autocast. With
// LayerNormOutput::kAutocastDtype under autocast it is at::layer_norm's output cast to bf16, as a
// matmul reading it would cast it: the output within one bf16 rounding (relative 1e-2), the
// gradients within fp32 summation order. add_layer_norm is input + branch and at::layer_norm of
// the sum, and residual_layer_norm its input and at::layer_norm of it, within the same
// tolerances.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>

#include "pipetrain/layer_norm.h"
#include "util/compat.h"

namespace pipetrain::testing::layer_norm_test {
namespace {

struct Result {
  at::Tensor output, grad_input, grad_weight, grad_bias;
};

Result run(bool ours, const std::vector<int64_t>& shape, c10::Device device, bool autocast,
           LayerNormOutput dtype) {
  torch::manual_seed(3);
  const auto options = torch::TensorOptions().device(device);
  const int64_t columns = shape.back();
  const auto input = torch::randn(shape, options).mul_(2).add_(0.5).requires_grad_(true);
  const auto weight = torch::randn({columns}, options).requires_grad_(true);
  const auto bias = torch::randn({columns}, options).requires_grad_(true);
  const auto grad = torch::randn(shape, options);
  if (autocast) set_autocast_to_bf16(device.type(), true);
  at::Tensor output;
  if (ours) {
    output = pipetrain::layer_norm(input, weight, bias, 1e-5, dtype);
  } else {
    output = at::layer_norm(input, {columns}, weight, bias, 1e-5);
    if (autocast && dtype == LayerNormOutput::kAutocastDtype) output = output.to(at::kBFloat16);
  }
  if (autocast) set_autocast_to_bf16(device.type(), false);
  output.backward(grad.to(output.scalar_type()));
  return {output.detach(), input.grad(), weight.grad(), bias.grad()};
}

void expect_as_aten(c10::Device device, bool autocast,
                    LayerNormOutput dtype = LayerNormOutput::kFloat) {
  const bool rounded = autocast && dtype == LayerNormOutput::kAutocastDtype;
  for (const auto& shape :
       std::vector<std::vector<int64_t>>{{4, 128, 768}, {3, 5, 100}, {2, 64, 1280}, {7, 33}}) {
    SCOPED_TRACE("shape [" + c10::Join(", ", shape) + "]" + (autocast ? ", autocast" : "") +
                 (rounded ? ", bf16 output" : ""));
    const Result expected = run(false, shape, device, autocast, dtype);
    const Result actual = run(true, shape, device, autocast, dtype);
    EXPECT_EQ(actual.output.scalar_type(), expected.output.scalar_type());
    EXPECT_TRUE(torch::allclose(actual.output.to(at::kFloat), expected.output.to(at::kFloat),
                                rounded ? 1e-2 : 1e-5, 1e-5));
    EXPECT_TRUE(torch::allclose(actual.grad_input, expected.grad_input, 1e-5, 1e-5));
    EXPECT_TRUE(torch::allclose(actual.grad_weight, expected.grad_weight, 1e-5, 1e-5))
        << (actual.grad_weight - expected.grad_weight).abs().max().item<float>();
    EXPECT_TRUE(torch::allclose(actual.grad_bias, expected.grad_bias, 1e-5, 1e-5))
        << (actual.grad_bias - expected.grad_bias).abs().max().item<float>();
  }
}

// add_layer_norm against input + branch and at::layer_norm of it (with no branch type:
// residual_layer_norm against input itself and at::layer_norm of it), with a gradient arriving at
// both outputs (the residual's from further along the stream), for an fp32 input and a branch of
// `branch_type`: outputs and gradients within fp32 summation order, as above (the normalised
// output within one rounding where it is bf16).
void expect_residual_as_aten(c10::Device device, std::optional<at::ScalarType> branch_type,
                             bool autocast, LayerNormOutput dtype) {
  const bool rounded = autocast && dtype == LayerNormOutput::kAutocastDtype;
  for (const auto& shape : std::vector<std::vector<int64_t>>{{4, 128, 768}, {7, 33}}) {
    SCOPED_TRACE("shape [" + c10::Join(", ", shape) + "], branch " +
                 (branch_type ? c10::toString(*branch_type) : "none") +
                 (autocast ? ", autocast" : "") + (rounded ? ", bf16 output" : ""));
    std::vector<at::Tensor> expected, actual;
    for (const bool ours : {false, true}) {
      torch::manual_seed(5);
      const auto options = torch::TensorOptions().device(device);
      const int64_t columns = shape.back();
      const auto input = torch::randn(shape, options).mul_(2).requires_grad_(true);
      const at::Tensor branch =
          branch_type ? torch::randn(shape, options).to(*branch_type).requires_grad_(true)
                      : at::Tensor();
      const auto weight = torch::randn({columns}, options).requires_grad_(true);
      const auto bias = torch::randn({columns}, options).requires_grad_(true);
      const auto grad_sum = torch::randn(shape, options);
      const auto grad = torch::randn(shape, options);
      if (autocast) set_autocast_to_bf16(device.type(), true);
      at::Tensor sum, normalised;
      if (ours) {
        const auto outputs =
            branch_type ? pipetrain::add_layer_norm(input, branch, weight, bias, 1e-5, dtype)
                        : pipetrain::residual_layer_norm(input, weight, bias, 1e-5, dtype);
        sum = outputs.residual;
        normalised = outputs.normalised;
      } else {
        sum = branch_type ? input + branch : input;
        normalised = at::layer_norm(sum, {columns}, weight, bias, 1e-5);
        if (rounded) normalised = normalised.to(at::kBFloat16);
      }
      if (autocast) set_autocast_to_bf16(device.type(), false);
      torch::autograd::backward({sum, normalised}, {grad_sum, grad.to(normalised.scalar_type())});
      auto& into = ours ? actual : expected;
      into = {sum.detach(), normalised.detach(), input.grad(), weight.grad(), bias.grad()};
      if (branch_type) into.push_back(branch.grad());
    }
    const char* names[] = {"residual",    "normalised", "input grad",
                           "weight grad", "bias grad",  "branch grad"};
    for (size_t i = 0; i < expected.size(); ++i) {
      SCOPED_TRACE(names[i]);
      EXPECT_EQ(actual[i].scalar_type(), expected[i].scalar_type());
      const bool low = actual[i].scalar_type() != at::kFloat;
      EXPECT_TRUE(torch::allclose(actual[i].to(at::kFloat), expected[i].to(at::kFloat),
                                  low ? 1e-2 : 1e-5, 1e-5))
          << (actual[i].to(at::kFloat) - expected[i].to(at::kFloat)).abs().max().item<float>();
    }
  }
}

TEST(LayerNorm, OnCpuIsAtensLayerNorm) {
  expect_as_aten(c10::Device(c10::DeviceType::CPU), false);
  expect_as_aten(c10::Device(c10::DeviceType::CPU), false, LayerNormOutput::kAutocastDtype);
  for (const auto type :
       {std::optional<at::ScalarType>(), std::optional(at::kFloat), std::optional(at::kBFloat16)}) {
    expect_residual_as_aten(c10::Device(c10::DeviceType::CPU), type, false,
                            LayerNormOutput::kFloat);
  }
}

TEST(LayerNorm, CudaGradientsEqualAtens) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  expect_as_aten(c10::Device(c10::DeviceType::CUDA), false);
  expect_as_aten(c10::Device(c10::DeviceType::CUDA), true);
  expect_as_aten(c10::Device(c10::DeviceType::CUDA), false, LayerNormOutput::kAutocastDtype);
  expect_as_aten(c10::Device(c10::DeviceType::CUDA), true, LayerNormOutput::kAutocastDtype);
}

TEST(LayerNorm, CudaResidualAndAddLayerNormEqualAtens) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  const c10::Device cuda(c10::DeviceType::CUDA);
  for (const auto type :
       {std::optional<at::ScalarType>(), std::optional(at::kFloat), std::optional(at::kBFloat16)}) {
    expect_residual_as_aten(cuda, type, false, LayerNormOutput::kFloat);
    expect_residual_as_aten(cuda, type, true, LayerNormOutput::kFloat);
    expect_residual_as_aten(cuda, type, true, LayerNormOutput::kAutocastDtype);
  }
}

}  // namespace
}  // namespace pipetrain::testing::layer_norm_test
