// nn::gpt2 and nn::gpt2_layers: the same layers under the same names and shapes, the head tied to
// wte (the tensor itself in the Sequential, a tie by name in the specs), each spec's parameter
// count its layer's own; GPT-2's initialisation; a sequence longer than the block size refused.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <vector>

#include "pipetrain/pipetrain.h"
#include "support/small_models.h"

namespace pipetrain::testing::gpt2_builder_test {
namespace {

nn::Gpt2Config small() {
  return tiny_gpt2_config(/*vocab_size=*/40, /*n_layer=*/3, /*block_size=*/8);
}

TEST(Gpt2Builder, TheSequentialAndTheSpecsHaveTheSameLayersNamesShapesAndTie) {
  const auto config = small();
  const auto whole = nn::gpt2(config);
  const auto specs = nn::gpt2_layers(config);
  ASSERT_EQ(specs.size(), whole->size());
  ASSERT_EQ(specs.size(), static_cast<size_t>(config.n_layer + 3));

  // The specs built as one process holding every layer builds them: the tied head shares.
  torch::nn::Sequential built;
  for (const auto& spec : specs) {
    auto layer = spec.tied_to.empty() ? spec.build() : spec.build_sharing(built);
    int64_t own = 0;
    for (const auto& parameter : layer.ptr()->parameters()) own += parameter.numel();
    if (spec.tied_to.empty()) EXPECT_EQ(spec.parameters, own) << "layer " << built->size();
    built->push_back(layer);
  }
  const auto ours = built->named_parameters(), theirs = whole->named_parameters();
  std::map<std::string, std::vector<int64_t>> our_shapes, their_shapes;
  for (const auto& item : ours) our_shapes[item.key()] = item.value().sizes().vec();
  for (const auto& item : theirs) their_shapes[item.key()] = item.value().sizes().vec();
  EXPECT_EQ(our_shapes, their_shapes);
  EXPECT_EQ(our_shapes.count("0.wte.weight"), 1u);
  EXPECT_EQ(our_shapes.count("1.attn.c_attn.bias"), 1u);
  EXPECT_EQ(our_shapes.count("4.bias"), 1u);  // ln_f

  const std::string head = std::to_string(config.n_layer + 2) + ".weight";
  EXPECT_TRUE(theirs[head].is_same(theirs["0.wte.weight"]));
  EXPECT_TRUE(ours[head].is_same(ours["0.wte.weight"]));
  EXPECT_EQ(specs.back().tied_to, (std::map<std::string, std::string>{{"weight", "0.wte.weight"}}));
  // A process without the embedding builds a head of its own, to take wte's values by the tie.
  EXPECT_EQ(specs.back().build().ptr()->parameters().front().sizes(),
            torch::IntArrayRef({config.vocab_size, config.n_embd}));
}

TEST(Gpt2Builder, InitialisesAsGpt2) {
  auto config = small();
  config.n_layer = 4;
  config.n_embd = 256;
  torch::manual_seed(0);
  auto gpt2 = nn::gpt2(config);
  ASSERT_EQ(gpt2->size(), 7u);
  const auto parameters = gpt2->named_parameters();
  EXPECT_NEAR(parameters["0.wte.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(parameters["0.wpe.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(parameters["2.mlp.c_fc.weight"].std().item<double>(), 0.02, 0.001);
  const double residual = 0.02 / std::sqrt(8.0);
  EXPECT_NEAR(parameters["2.attn.c_proj.weight"].std().item<double>(), residual, 0.1 * residual);
  EXPECT_NEAR(parameters["2.mlp.c_proj.weight"].std().item<double>(), residual, 0.1 * residual);
  EXPECT_EQ(parameters["1.attn.c_attn.bias"].abs().max().item<double>(), 0);
  EXPECT_TRUE(torch::equal(parameters["5.weight"], torch::ones({256})));
  EXPECT_TRUE(torch::equal(parameters["1.ln_1.bias"], torch::zeros({256})));
}

TEST(Gpt2Builder, RefusesALongerSequenceAndAShapeThatDoesNotFit) {
  auto gpt2 = nn::gpt2(small());
  EXPECT_EQ(gpt2->forward(torch::zeros({2, 8}, torch::kInt64)).sizes(),
            torch::IntArrayRef({2, 8, 40}));
  try {
    gpt2->forward(torch::zeros({1, 9}, torch::kInt64));
    FAIL() << "9 tokens went through a block size of 8";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("block size 8"), std::string::npos) << e.what();
  }
  auto config = small();
  config.n_head = 3;
  EXPECT_THROW(nn::gpt2(config), std::invalid_argument);
  EXPECT_THROW(nn::gpt2_layers(config), std::invalid_argument);
  EXPECT_THROW(nn::gpt2_preset("1B"), std::invalid_argument);
  EXPECT_EQ(nn::gpt2_preset("350M").n_layer, 24);
}

}  // namespace
}  // namespace pipetrain::testing::gpt2_builder_test
