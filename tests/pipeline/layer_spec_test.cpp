// A model described layer by layer: each layer built alone under its own seed, so any subset of
// layers a process holds has the weights the whole model has; placeholders stand where others
// hold layers, and a tied layer shares its target's tensor only where the target is built here.
#include "pipetrain/layer_spec.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/errors.h"

namespace pipetrain::testing::layer_spec_test {
namespace {

// 4 -> 8 -> 4 -> 8, the last layer tied to the first (weights of one shape, [8, 4]).
std::vector<LayerSpec> three_linears() {
  auto tied_head = [](const torch::nn::Sequential& built) {
    torch::nn::Linear head(4, 8);
    head->weight = built->ptr<torch::nn::LinearImpl>(0)->weight;
    return head;
  };
  std::vector<LayerSpec> specs;
  specs.push_back(layer([] { return torch::nn::Linear(4, 8); }, 4 * 8 + 8));
  specs.push_back(layer([] { return torch::nn::Linear(8, 4); }));
  specs.push_back(
      layer([] { return torch::nn::Linear(4, 8); }).tie("weight", "0.weight", tied_head));
  return specs;
}

TEST(LayerSpec, ALayersWeightsAreTheSameWhicheverLayersAProcessBuilds) {
  const auto specs = three_linears();
  torch::manual_seed(123);
  const auto before = torch::rand({1});
  torch::manual_seed(123);
  const auto whole = build_layers(specs, {true, true, true}, 7);
  const auto after = torch::rand({1});
  EXPECT_TRUE(torch::equal(before, after)) << "building drew from the run's generator";
  const auto middle = build_layers(specs, {false, true, false}, 7);
  EXPECT_TRUE(torch::equal(whole->ptr<torch::nn::LinearImpl>(1)->weight,
                           middle->ptr<torch::nn::LinearImpl>(1)->weight));
  const auto other_seed = build_layers(specs, {false, true, false}, 8);
  EXPECT_FALSE(torch::equal(middle->ptr<torch::nn::LinearImpl>(1)->weight,
                            other_seed->ptr<torch::nn::LinearImpl>(1)->weight));

  EXPECT_TRUE(is_held(middle, 1));
  EXPECT_FALSE(is_held(middle, 0));
  EXPECT_TRUE(held_elsewhere(middle, "0.weight"));
  EXPECT_FALSE(held_elsewhere(middle, "1.weight"));
  EXPECT_FALSE(held_elsewhere(middle, "weight"));
  const auto message = error_of<std::logic_error>([&] {
    middle->ptr<NotHeldImpl>(0)->forward(torch::ones({1, 4}));
  });
  EXPECT_NE(message.find("layer 0 is held by another process"), std::string::npos) << message;
  EXPECT_EQ(layer_sizes(specs, 7), (std::vector<int64_t>{40, 36, 40}));
}

TEST(LayerSpec, ATiedLayerSharesItsTargetsTensorOnlyWhereTheTargetIsBuiltHere) {
  const auto specs = three_linears();
  const auto whole = build_layers(specs, {true, true, true}, 7);
  EXPECT_TRUE(whole->ptr<torch::nn::LinearImpl>(2)->weight.is_same(
      whole->ptr<torch::nn::LinearImpl>(0)->weight));
  const auto apart = build_layers(specs, {false, false, true}, 7);
  EXPECT_EQ(apart->ptr<torch::nn::LinearImpl>(2)->weight.sizes(), (std::vector<int64_t>{8, 4}));
}

TEST(LayerSpec, ALayerWithoutABuildFunctionIsRefusedByItsIndex) {
  auto specs = three_linears();
  specs[1].build = nullptr;
  const auto message = error_of<std::invalid_argument>([&] {
    build_layers(specs, {true, true, true}, 7);
  });
  EXPECT_NE(message.find("LayerSpec 1 has no build function"), std::string::npos) << message;
}

}  // namespace
}  // namespace pipetrain::testing::layer_spec_test
