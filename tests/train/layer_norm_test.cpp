// pipetrain::layer_norm is at::layer_norm over the last dimension: the same output, and on a GPU
// (where its weight and bias gradients come from pipetrain's kernel, in a build with nvcc; from
// ATen's otherwise) the same gradients within
// fp32 summation order (relative 1e-5, absolute 1e-5), for rows and columns that fill the
// kernel's blocks and ones that do not, with and without autocast.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/compat.h"
#include "pipetrain/layer_norm.h"

namespace pipetrain::testing {
namespace {

struct Result {
  at::Tensor output, grad_input, grad_weight, grad_bias;
};

Result run(bool ours, const std::vector<int64_t>& shape, c10::Device device, bool autocast) {
  torch::manual_seed(3);
  const auto options = torch::TensorOptions().device(device);
  const int64_t columns = shape.back();
  const auto input = torch::randn(shape, options).mul_(2).add_(0.5).requires_grad_(true);
  const auto weight = torch::randn({columns}, options).requires_grad_(true);
  const auto bias = torch::randn({columns}, options).requires_grad_(true);
  const auto grad = torch::randn(shape, options);
  if (autocast) set_autocast_to_bf16(device.type(), true);
  const at::Tensor output = ours ? pipetrain::layer_norm(input, weight, bias, 1e-5)
                                 : at::layer_norm(input, {columns}, weight, bias, 1e-5);
  if (autocast) set_autocast_to_bf16(device.type(), false);
  output.backward(grad.to(output.scalar_type()));
  return {output.detach(), input.grad(), weight.grad(), bias.grad()};
}

void expect_as_aten(c10::Device device, bool autocast) {
  for (const auto& shape : std::vector<std::vector<int64_t>>{{4, 128, 768}, {3, 5, 100}, {7, 33}}) {
    SCOPED_TRACE("shape [" + c10::Join(", ", shape) + "]" + (autocast ? ", autocast" : ""));
    const Result expected = run(false, shape, device, autocast);
    const Result actual = run(true, shape, device, autocast);
    EXPECT_EQ(actual.output.scalar_type(), expected.output.scalar_type());
    EXPECT_TRUE(torch::allclose(actual.output, expected.output, 1e-6, 1e-6));
    EXPECT_TRUE(torch::allclose(actual.grad_input, expected.grad_input, 1e-5, 1e-5));
    EXPECT_TRUE(torch::allclose(actual.grad_weight, expected.grad_weight, 1e-5, 1e-5))
        << (actual.grad_weight - expected.grad_weight).abs().max().item<float>();
    EXPECT_TRUE(torch::allclose(actual.grad_bias, expected.grad_bias, 1e-5, 1e-5))
        << (actual.grad_bias - expected.grad_bias).abs().max().item<float>();
  }
}

TEST(LayerNorm, OnCpuIsAtensLayerNorm) { expect_as_aten(c10::Device(c10::DeviceType::CPU), false); }

TEST(LayerNorm, CudaGradientsEqualAtens) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  expect_as_aten(c10::Device(c10::DeviceType::CUDA), false);
  expect_as_aten(c10::Device(c10::DeviceType::CUDA), true);
}

}  // namespace
}  // namespace pipetrain::testing
