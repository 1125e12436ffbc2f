// Layers measured one at a time: the bytes each holds from forward to backward, counted by the
// allocator, and its parameters', on a model of one's own whose numbers can be worked out by hand.
#include "train/layer_profile.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/module.h"

namespace pipetrain::testing::layer_profile_test {
namespace {

TEST(LayerProfile, CountsWhatEachLayerHoldsAndOwns) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::ReLU(),
                              torch::nn::Linear(16, 4));
  int64_t built = 0;
  const auto profiles = profile_layers(
      3,
      [&](int64_t index) {
        ++built;
        return *(model->begin() + index);
      },
      {torch::randn({5, 8}), torch::randn({10, 8})}, c10::Device(c10::kCPU), /*repeats=*/1,
      [](std::vector<at::Tensor> parameters) {
        return std::unique_ptr<torch::optim::Optimizer>(
            std::make_unique<torch::optim::SGD>(std::move(parameters), 0.1));
      });
  EXPECT_EQ(built, 3);  // once each, for both micro-batch sizes
  ASSERT_EQ(profiles.size(), 2u);
  EXPECT_EQ(profiles[1].rows, 10);
  EXPECT_EQ(profiles[1].layers[0].activation_bytes, 10 * 16 * 4);
  const LayerProfile& profile = profiles[0];
  EXPECT_EQ(profile.rows, 5);
  EXPECT_EQ(profile.input_bytes, 5 * 8 * 4);
  ASSERT_EQ(profile.layers.size(), 3u);
  // Each layer's output is what it allocates and keeps (Linear saves its input and weight, ReLU
  // its result: tensors that exist anyway).
  const std::vector<int64_t> outputs{5 * 16 * 4, 5 * 16 * 4, 5 * 4 * 4};
  const std::vector<int64_t> parameters{(8 * 16 + 16) * 4, 0, (16 * 4 + 4) * 4};
  for (size_t i = 0; i < 3; ++i) {
    const LayerCost& c = profile.layers[i];
    EXPECT_EQ(c.output_bytes, outputs[i]) << "layer " << i;
    EXPECT_EQ(c.activation_bytes, outputs[i]) << "layer " << i;
    EXPECT_EQ(c.parameter_bytes, parameters[i]) << "layer " << i;
    EXPECT_GT(c.forward_seconds, 0) << "layer " << i;
    EXPECT_GT(c.backward_seconds, 0) << "layer " << i;
    // An optimizer steps only layers with parameters.
    EXPECT_EQ(c.optimizer_seconds > 0, parameters[i] > 0) << "layer " << i;
    // The output's gradient at least: the backward's seed.
    EXPECT_GE(c.workspace_bytes, outputs[i]) << "layer " << i;
  }
}

TEST(LayerProfile, AnEmbeddingTakesIntegerTokens) {
  torch::manual_seed(0);
  torch::nn::Embedding embedding(32, 8);
  const auto profile = profile_layers(
      1, [&](int64_t) { return torch::nn::AnyModule(embedding); }, {torch::randint(0, 32, {2, 3})},
      c10::Device(c10::kCPU), 1)[0];
  EXPECT_EQ(profile.layers[0].output_bytes, 2 * 3 * 8 * 4);
  EXPECT_EQ(profile.layers[0].input_backward_seconds, 0);  // no gradient for tokens
  EXPECT_GT(profile.layers[0].weight_backward_seconds, 0);
  EXPECT_EQ(profile.layers[0].parameter_bytes, 32 * 8 * 4);
  EXPECT_EQ(profile.layers[0].optimizer_seconds, 0);  // no optimizer given
}

// A head that multiplies by another layer's weight (transposed): one tensor, two layers.
struct TiedHeadImpl : torch::nn::Module {
  explicit TiedHeadImpl(const at::Tensor& tied) { weight = register_parameter("weight", tied); }
  at::Tensor forward(const at::Tensor& x) { return torch::matmul(x, weight); }
  at::Tensor weight;
};
TORCH_MODULE(TiedHead);

class TiedModel : public Module {
 public:
  explicit TiedModel(torch::nn::Sequential layers) : Module(std::move(layers)) {}
  at::Tensor training_step(const Batch& batch, int64_t) override {
    return forward(batch.data).sum();
  }
  OptimizerConfig configure_optimizers() override {
    return OptimizerConfig(std::make_unique<torch::optim::SGD>(parameters(), 0.1));
  }
};

TEST(LayerProfile, ParametersTwoLayersShareAreNotedOnTheLaterLayer) {
  torch::manual_seed(0);
  torch::nn::Linear in(6, 4);
  TiedModel model(torch::nn::Sequential(in, torch::nn::Tanh(), TiedHead(in->weight)));
  const auto profiles =
      profile_module(model, torch::randn({2, 6}), c10::Device(c10::kCPU), "32-true", 1);
  const LayerProfile& profile = profiles.at(1);
  EXPECT_TRUE(profile.layers[0].shared_parameter_bytes.empty());
  EXPECT_EQ(profile.layers[2].parameter_bytes, 6 * 4 * 4);
  EXPECT_EQ(profile.layers[2].shared_parameter_bytes, (std::map<int64_t, int64_t>{{0, 6 * 4 * 4}}));
}

}  // namespace
}  // namespace pipetrain::testing::layer_profile_test
