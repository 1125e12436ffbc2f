// The names a Hugging Face folder gives a model's tensors (hf_decoder_tensors, hf_gpt2_tensors):
// pure data, checked here against the modules pipetrain builds, without a file.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <set>
#include <string>

#include "pipetrain/hf_decoder.h"
#include "pipetrain/hf_folder.h"
#include "pipetrain/hf_gpt2.h"
#include "support/small_models.h"

namespace pipetrain::testing::hf_names_test {
namespace {

// Each tensor named once, on both sides, and every parameter of `model` listed with its shape,
// but for `tied` (a head stored under the embedding's name).
void expect_covers(const std::vector<HfTensor>& tensors, const torch::nn::Sequential& model,
                   const std::string& tied) {
  std::set<std::string> ours, theirs;
  for (const auto& tensor : tensors) {
    EXPECT_TRUE(ours.insert(tensor.name).second) << tensor.name;
    EXPECT_TRUE(theirs.insert(tensor.hf_name).second) << tensor.hf_name;
  }
  std::map<std::string, at::Tensor> parameters;
  for (const auto& item : model->named_parameters()) parameters[item.key()] = item.value();
  for (const auto& tensor : tensors) {
    ASSERT_TRUE(parameters.count(tensor.name)) << tensor.name << " is not a parameter";
    EXPECT_EQ(parameters.at(tensor.name).sizes().vec(), tensor.shape) << tensor.name;
  }
  for (const auto& [name, value] : parameters) {
    EXPECT_TRUE(ours.count(name) || name == tied) << name << " has no Hugging Face name";
  }
}

std::map<std::string, std::string> by_name(const std::vector<HfTensor>& tensors) {
  std::map<std::string, std::string> names;
  for (const auto& tensor : tensors) names[tensor.name] = tensor.hf_name;
  return names;
}

TEST(HfNames, ADecoderIsNamedAsTransformersNamesLlamaAndQwen3) {
  auto config = tiny_qwen3_config(64, 2, 8);
  config.tie_word_embeddings = false;
  const auto tensors = hf_decoder_tensors(config);
  expect_covers(tensors, nn::decoder(config), "");
  const auto names = by_name(tensors);
  EXPECT_EQ(names.at("0.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(names.at("2.self_attn.q_proj.weight"), "model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(names.at("1.self_attn.k_norm.weight"), "model.layers.0.self_attn.k_norm.weight");
  EXPECT_EQ(names.at("1.mlp.down_proj.weight"), "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(names.at("3.weight"), "model.norm.weight");
  EXPECT_EQ(names.at("4.weight"), "lm_head.weight");
  for (const auto& tensor : tensors) EXPECT_FALSE(tensor.transposed) << tensor.name;
  // The first tensor is the embedding, the last the head: save_pretrained's order.
  EXPECT_EQ(tensors.front().hf_name, "model.embed_tokens.weight");
  EXPECT_EQ(tensors.back().hf_name, "lm_head.weight");
}

TEST(HfNames, ATiedDecoderStoresItsHeadOnceUnderTheEmbeddingsName) {
  auto config = tiny_llama3_config(64, 2, 8);
  config.tie_word_embeddings = true;
  const auto tensors = hf_decoder_tensors(config);
  expect_covers(tensors, nn::decoder(config), "4.weight");
  EXPECT_EQ(by_name(tensors).count("4.weight"), 0u);
  EXPECT_EQ(by_name(tensors).count("1.self_attn.q_norm.weight"), 0u);  // Llama has no q/k norms
}

TEST(HfNames, Gpt2sConv1DProjectionsAreStoredTransposed) {
  const auto config = tiny_gpt2_config(64, 2, 8);
  const auto tensors = hf_gpt2_tensors(config);
  expect_covers(tensors, nn::gpt2(config), "4.weight");
  std::map<std::string, const HfTensor*> by_ours;
  for (const auto& tensor : tensors) by_ours[tensor.name] = &tensor;
  EXPECT_EQ(by_ours.at("0.wte.weight")->hf_name, "transformer.wte.weight");
  EXPECT_EQ(by_ours.at("2.attn.c_attn.weight")->hf_name, "transformer.h.1.attn.c_attn.weight");
  EXPECT_EQ(by_ours.at("3.bias")->hf_name, "transformer.ln_f.bias");
  for (const char* linear : {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}) {
    EXPECT_TRUE(by_ours.at(std::string("1.") + linear + ".weight")->transposed) << linear;
    EXPECT_FALSE(by_ours.at(std::string("1.") + linear + ".bias")->transposed) << linear;
  }
  EXPECT_FALSE(by_ours.at("1.ln_1.weight")->transposed);
}

TEST(HfNames, WeightsGoToHuggingFacesNamesAndLayoutAndBack) {
  const auto config = tiny_gpt2_config(64, 1, 8);
  const auto tensors = hf_gpt2_tensors(config);
  std::map<std::string, at::Tensor> weights;
  for (const auto& item : nn::gpt2(config)->named_parameters()) {
    weights[item.key()] = item.value().detach();
  }
  const TensorMap stored = to_hf_names(weights, tensors);
  EXPECT_EQ(stored.size(), tensors.size());
  EXPECT_EQ(stored.at("transformer.h.0.mlp.c_fc.weight").sizes().vec(),
            (std::vector<int64_t>{16, 64}));  // [in, out]
  const auto back = from_hf_names(stored, tensors);
  EXPECT_EQ(back.size(), tensors.size());
  for (const auto& [name, tensor] : back) EXPECT_TRUE(tensor.equal(weights.at(name))) << name;
  weights.erase("1.mlp.c_fc.bias");
  EXPECT_THROW(to_hf_names(weights, tensors), std::invalid_argument);
}

}  // namespace
}  // namespace pipetrain::testing::hf_names_test
