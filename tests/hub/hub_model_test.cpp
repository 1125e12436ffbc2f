// A Hub folder opened as one model (hub_model.h): its family from config.json's model_type, its
// layers read from the folder, and its weights written back as a folder of the same model.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "pipetrain/hf_decoder.h"
#include "pipetrain/hf_gpt2.h"
#include "pipetrain/hub_model.h"
#include "pipetrain/layer_spec.h"
#include "support/small_models.h"
#include "support/temp_dir.h"

namespace pipetrain::testing::hub_model_test {
namespace {

namespace fs = std::filesystem;

std::map<std::string, at::Tensor> weights_of(const torch::nn::Sequential& model) {
  std::map<std::string, at::Tensor> weights;
  for (const auto& item : model->named_parameters()) weights[item.key()] = item.value().detach();
  return weights;
}

// The layers built whole, as one process holding every stage builds them.
torch::nn::Sequential built(const std::vector<LayerSpec>& layers) {
  return build_layers(layers, std::vector<bool>(layers.size(), true), 0);
}

class HubModelTest : public TempDirTest {};

TEST_F(HubModelTest, AQwen3FolderOpensAsItsFamilyAndItsLayersHoldItsWeights) {
  torch::manual_seed(3);
  const auto config = tiny_qwen3_config(64, 2, 8);
  const auto weights = weights_of(nn::decoder(config));
  export_hf_decoder(weights, config, "qwen3", dir + "/qwen3", kHfDefaultMaxShardBytes, at::kFloat);

  const auto hub = HubModel::open(dir + "/qwen3");
  EXPECT_EQ(hub.model_type(), "qwen3");
  EXPECT_EQ(hub.family().architecture, HubArchitecture::kDecoder);
  ASSERT_NE(hub.decoder_config(), nullptr);
  EXPECT_EQ(hub.gpt2_config(), nullptr);
  EXPECT_EQ(hub.vocab_size(), 64);
  EXPECT_DOUBLE_EQ(hub.flops_per_token(), nn::decoder_flops_per_token(*hub.decoder_config()));
  const auto layers = hub.layers();
  ASSERT_EQ(layers.size(), 5u);
  for (const auto& [name, tensor] : weights_of(built(layers))) {
    EXPECT_TRUE(tensor.equal(weights.at(name))) << name;
  }

  // Written back, a folder of the same model.
  hub.export_weights(weights, dir + "/again", HubExportOptions().dtype(at::kFloat));
  EXPECT_TRUE(fs::is_regular_file(dir + "/again/model.safetensors"));
  const auto again = HubModel::open(dir + "/again");
  EXPECT_EQ(again.model_type(), "qwen3");
  for (const auto& [name, tensor] : read_hf_decoder_weights(dir + "/again", config)) {
    EXPECT_TRUE(tensor.equal(weights.at(name))) << name;
  }
}

TEST_F(HubModelTest, AGpt2FolderOpensAsGpt2) {
  torch::manual_seed(4);
  const auto config = tiny_gpt2_config(64, 2, 8);
  const auto weights = weights_of(nn::gpt2(config));
  export_hf_gpt2(weights, config, dir + "/gpt2");
  const auto hub = HubModel::open(dir + "/gpt2");
  EXPECT_EQ(hub.model_type(), "gpt2");
  ASSERT_NE(hub.gpt2_config(), nullptr);
  EXPECT_EQ(hub.block_size(), 8);
  EXPECT_DOUBLE_EQ(hub.flops_per_token(), nn::gpt2_flops_per_token(config));
  for (const auto& [name, tensor] : weights_of(built(hub.layers()))) {
    EXPECT_TRUE(tensor.equal(weights.at(name))) << name;
  }
  EXPECT_THROW(hub.export_weights(weights, dir + "/bf16", HubExportOptions().dtype(at::kBFloat16)),
               std::invalid_argument);
}

TEST_F(HubModelTest, AModelTypeOfNoFamilyIsRefusedNamingIt) {
  fs::create_directories(dir + "/mistral");
  std::ofstream(dir + "/mistral/config.json") << R"({"model_type": "mistral"})";
  try {
    HubModel::open(dir + "/mistral");
    FAIL() << "opened a mistral";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("\"model_type\" is \"mistral\", a model pipetrain does "
                                         "not build: it reads gpt2, llama and qwen3"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(find_hub_family("mistral"), nullptr);
  ASSERT_NE(find_hub_family("llama"), nullptr);
  EXPECT_EQ(find_hub_family("llama")->presets.front(), "llama-150m");
}

}  // namespace
}  // namespace pipetrain::testing::hub_model_test
