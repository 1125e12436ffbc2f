// Llama 3 and Qwen3 to and from Hugging Face's layout (hf_decoder.h). A decoder pipetrain
// exports gives, read by a PyTorch re-implementation of transformers' forward that shares no code
// with pipetrain (tests/io/llama_reference.py, skipped where no Python has torch), the logits
// pipetrain computes; a folder that script writes (transformers 4's and 5's RoPE spellings, in
// shards) reads into nn::decoder with the script's logits; an export reads back as it was (fp32
// bit for bit, bf16 rounded once); a folder that does not fit is refused naming the tensor or key.
// Logits agree in fp32 to max |ours - theirs| <= 1e-5 max |theirs|: the two sum in different
// orders, which costs a few fp32 ulps per layer, while any tensor misplaced costs far more.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "pipetrain/checkpoint_io.h"
#include "pipetrain/hf_decoder.h"
#include "pipetrain/nn/decoder.h"
#include "pipetrain/safetensors.h"
#include "support/command.h"
#include "support/multiprocess.h"
#include "support/small_models.h"

namespace pipetrain::testing::hf_decoder_test {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using Weights = std::map<std::string, at::Tensor>;

const std::string kScript = std::string(PIPETRAIN_SOURCE_DIR) + "/tests/io/llama_reference.py";
constexpr double kRelativeTolerance = 1e-5;
const std::vector<int64_t> kIds{1, 17, 42, 63, 0, 5, 33, 8, 21, 2};

// A Python that imports torch: Debian's, else the first on PATH; "" when neither does.
std::string python_with_torch() {
  for (const char* python : {"/usr/bin/python3", "python3"}) {
    if (run_command({python, "-c", "import torch"}).exit_code == 0) return python;
  }
  return "";
}

// A decoder small enough to export in milliseconds with every feature the layout has a name for.
struct Variant {
  std::string name;
  std::string model_type = "llama";
  bool tied = false;
  bool attention_bias = false;
  int64_t head_dim = 8;
  std::string rope_type = "llama3";
  int64_t max_shard_bytes = kHfDefaultMaxShardBytes;
};

nn::DecoderConfig config_of(const Variant& variant) {
  nn::DecoderConfig config = tiny_decoder_config(/*vocab_size=*/64, /*n_layer=*/2,
                                                 /*block_size=*/16);
  config.head_dim = variant.head_dim;
  config.max_position_embeddings = 128;
  config.rms_norm_eps = 1e-5;
  config.tie_word_embeddings = variant.tied;
  config.qk_norm = variant.model_type == "qwen3";
  config.attention_bias = variant.attention_bias;
  // original_max_position_embeddings 64 against head_dim 8 or 16 puts frequencies in each of
  // llama3's three bands (kept, smoothed, slowed by factor).
  config.rope.theta(variant.rope_type == "llama3" ? 10000.0 : 1e6)
      .rope_type(variant.rope_type)
      .factor(8.0)
      .low_freq_factor(1.0)
      .high_freq_factor(4.0)
      .original_max_position_embeddings(64);
  return config;
}

const std::vector<Variant>& exported_variants() {
  static const std::vector<Variant> variants{
      {"llama, its own head", "llama", false, false, 8, "llama3", kHfDefaultMaxShardBytes},
      {"llama, tied head, attention biases, in shards", "llama", true, true, 8, "llama3", 8000},
      {"qwen3, tied head, head_dim 16 (4 x 16 != 32)", "qwen3", true, false, 16, "default",
       kHfDefaultMaxShardBytes}};
  return variants;
}

// decoder(config) with weights that keep activations of order 1 and norms and biases away from
// 1 and 0: a tensor read into the wrong place then changes every logit.
torch::nn::Sequential random_decoder(const nn::DecoderConfig& config, uint64_t seed) {
  auto model = nn::decoder(config);
  torch::manual_seed(seed);
  torch::NoGradGuard no_grad;
  for (const auto& item : model->named_parameters()) {
    at::Tensor parameter = item.value();
    const bool bias = item.key().size() > 5 && item.key().substr(item.key().size() - 5) == ".bias";
    if (parameter.dim() == 2) {
      parameter.copy_(torch::randn_like(parameter) / std::sqrt(double(parameter.size(1))));
    } else if (bias) {
      parameter.copy_(torch::randn_like(parameter) * 0.1);
    } else {  // an RMSNorm's weight
      parameter.copy_(1.0 + torch::randn_like(parameter) * 0.3);
    }
  }
  model->eval();
  return model;
}

Weights weights_of(const torch::nn::Sequential& model) {
  Weights weights;
  for (const auto& item : model->named_parameters()) {
    weights[item.key()] = item.value().detach().clone();
  }
  return weights;
}

at::Tensor logits_of(torch::nn::Sequential& model) {
  torch::NoGradGuard no_grad;
  return model->forward(torch::tensor(kIds).unsqueeze(0)).squeeze(0);
}

// The logits llama_reference.py computes from `folder` for kIds, [T, vocab].
at::Tensor reference_logits(const std::string& python, const std::string& folder) {
  std::vector<std::string> argv{python, kScript, "logits", folder};
  for (const int64_t id : kIds) argv.push_back(std::to_string(id));
  const auto result = run_ok(argv);
  const auto trimmed = result.output.substr(0, result.output.find_last_not_of('\n') + 1);
  const auto rows =
      Json::parse(trimmed.substr(trimmed.rfind('\n') + 1)).get<std::vector<std::vector<float>>>();
  std::vector<at::Tensor> tensors;
  for (const auto& row : rows) tensors.push_back(torch::tensor(row));
  return torch::stack(tensors);
}

void expect_same_logits(const at::Tensor& ours, const at::Tensor& theirs) {
  ASSERT_EQ(ours.sizes(), theirs.sizes());
  const double largest = theirs.abs().max().item<double>();
  const double difference = (ours - theirs).abs().max().item<double>();
  EXPECT_GT(largest, 0.1) << "logits this small would hide a misplaced tensor";
  EXPECT_LE(difference, kRelativeTolerance * largest)
      << "the logits differ by " << difference << ", the largest is " << largest;
}

Json read_json(const std::string& path) {
  std::ifstream in(path);
  return Json::parse(in);
}

void write_json(const std::string& path, const Json& json) {
  std::ofstream(path, std::ios::trunc) << json.dump(2);
}

// The message of the std::invalid_argument `action` throws; a test failure when it throws none.
std::string invalid_argument_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const std::invalid_argument& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not an std::invalid_argument: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

void expect_mentions(const std::string& message, const std::vector<std::string>& parts) {
  for (const auto& part : parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "\"" << part << "\" not in: " << message;
  }
}

class HfDecoder : public ::testing::Test {
 protected:
  void TearDown() override { fs::remove_all(dir_); }
  std::string folder(const std::string& name) const { return dir_ + "/" + name; }
  // A random decoder of `variant` exported in fp32 into folder(name); returns its weights.
  Weights export_variant(const Variant& variant, const std::string& name,
                         at::ScalarType dtype = at::kFloat) const {
    const auto config = config_of(variant);
    const auto weights = weights_of(random_decoder(config, 7));
    export_hf_decoder(weights, config, variant.model_type, folder(name), variant.max_shard_bytes,
                      dtype);
    return weights;
  }

  std::string dir_ = make_temp_dir("hf-decoder");
};

TEST_F(HfDecoder, AnExportGivesTheReferenceForwardTheLogitsOfTheDecoder) {
  const std::string python = python_with_torch();
  if (python.empty()) GTEST_SKIP() << "no Python with torch (Debian: python3-torch)";
  for (const auto& variant : exported_variants()) {
    SCOPED_TRACE(variant.name);
    const auto config = config_of(variant);
    auto model = random_decoder(config, 11);
    export_hf_decoder(weights_of(model), config, variant.model_type, folder("export"),
                      variant.max_shard_bytes, at::kFloat);
    expect_same_logits(logits_of(model), reference_logits(python, folder("export")));
  }
}

TEST_F(HfDecoder, AFolderPythonWroteReadsIntoTheDecoderWithItsLogits) {
  const std::string python = python_with_torch();
  if (python.empty()) GTEST_SKIP() << "no Python with torch (Debian: python3-torch)";
  struct Written {
    std::vector<std::string> flags;
    std::string model_type;
    bool tied;
    int64_t head_dim;
    std::string rope_type;
  };
  const std::vector<Written> folders{
      {{"--rope-spelling", "v4", "--max-shard-bytes", "20000"}, "llama", false, 16, "llama3"},
      {{"--rope-spelling", "v4-type", "--tied", "--attention-bias", "--max-shard-bytes", "9000"},
       "llama",
       true,
       16,
       "llama3"},
      // head_dim 8 = 32 / 4: config.json leaves it out, as Llama 3.0's do.
      {{"--rope-spelling", "v5", "--rope-type", "default", "--head-dim", "8"},
       "llama",
       false,
       8,
       "default"},
      {{"--rope-spelling", "v5", "--model-type", "qwen3", "--tied", "--dtype", "bfloat16",
        "--max-shard-bytes", "10000"},
       "qwen3",
       true,
       16,
       "llama3"}};
  int seed = 0;
  for (const auto& written : folders) {
    const std::string path = folder("python-" + std::to_string(seed));
    std::vector<std::string> argv{python, kScript, "write", path, "--seed", std::to_string(seed++)};
    argv.insert(argv.end(), written.flags.begin(), written.flags.end());
    SCOPED_TRACE(::testing::PrintToString(argv));
    run_ok(argv);

    std::string model_type, dtype;
    const auto config = read_hf_decoder_config(path, &model_type, &dtype);
    EXPECT_EQ(model_type, written.model_type);
    EXPECT_EQ(dtype, written.model_type == "qwen3" ? "bfloat16" : "float32");
    EXPECT_EQ(config.n_layer, 2);
    EXPECT_EQ(config.n_embd, 32);
    EXPECT_EQ(config.n_head, 4);
    EXPECT_EQ(config.kv_heads(), 2);
    EXPECT_EQ(config.head_size(), written.head_dim);
    EXPECT_EQ(config.intermediate_size, 48);
    EXPECT_EQ(config.vocab_size, 64);
    EXPECT_EQ(config.max_position_embeddings, 128);
    EXPECT_EQ(config.block_size, 128) << "at most the model's positions";
    EXPECT_EQ(config.tie_word_embeddings, written.tied);
    EXPECT_EQ(config.qk_norm, written.model_type == "qwen3");
    EXPECT_EQ(config.rope.rope_type(), written.rope_type);
    EXPECT_DOUBLE_EQ(config.rope.theta(), 10000.0);
    if (written.rope_type == "llama3") {
      EXPECT_DOUBLE_EQ(config.rope.factor(), 8.0);
      EXPECT_EQ(config.rope.original_max_position_embeddings(), 64);
    }
    EXPECT_DOUBLE_EQ(config.rms_norm_eps, 1e-5);

    const auto weights = read_hf_decoder_weights(path, config);
    EXPECT_EQ(weights.count(std::to_string(config.n_layer + 2) + ".weight"), written.tied ? 0u : 1u)
        << "a tied head is filled through 0.weight";
    for (const auto& [name, tensor] : weights) EXPECT_EQ(tensor.scalar_type(), at::kFloat) << name;
    auto model = nn::decoder(config);
    load_weights(model, weights, path);
    model->eval();
    expect_same_logits(logits_of(model), reference_logits(python, path));
  }
}

TEST_F(HfDecoder, AnExportReadsBackAsItWasInFp32AndRoundedOnceInBf16) {
  const Variant variant = exported_variants()[1];  // tied, biased
  const auto config = config_of(variant);
  const auto weights = export_variant(variant, "fp32");
  std::string model_type, dtype;
  const auto read_config = read_hf_decoder_config(folder("fp32"), &model_type, &dtype);
  EXPECT_EQ(model_type, "llama");
  EXPECT_EQ(dtype, "float32");
  EXPECT_EQ(read_config.n_layer, config.n_layer);
  EXPECT_EQ(read_config.kv_heads(), config.kv_heads());
  EXPECT_EQ(read_config.head_size(), config.head_size());
  EXPECT_EQ(read_config.intermediate_size, config.intermediate_size);
  EXPECT_EQ(read_config.max_position_embeddings, config.max_position_embeddings);
  EXPECT_EQ(read_config.tie_word_embeddings, true);
  EXPECT_EQ(read_config.attention_bias, true);
  EXPECT_EQ(read_config.rope.rope_type(), "llama3");
  EXPECT_DOUBLE_EQ(read_config.rope.low_freq_factor(), config.rope.low_freq_factor());
  EXPECT_DOUBLE_EQ(read_config.rope.high_freq_factor(), config.rope.high_freq_factor());
  EXPECT_DOUBLE_EQ(read_config.rms_norm_eps, config.rms_norm_eps);

  const auto read = read_hf_decoder_weights(folder("fp32"), read_config);
  const std::string head = std::to_string(config.n_layer + 2) + ".weight";
  EXPECT_EQ(read.count(head), 0u) << "a tied head is filled through 0.weight";
  EXPECT_EQ(read.size(), weights.size() - 1);
  for (const auto& [name, tensor] : read) {
    EXPECT_TRUE(torch::equal(tensor, weights.at(name))) << name;
  }

  // In shards of at most 8000 bytes of tensors (one larger tensor alone), the index totalling
  // them, named as save_pretrained names them.
  const auto index = read_json(folder("fp32") + "/model.safetensors.index.json");
  EXPECT_FALSE(fs::exists(folder("fp32") + "/model.safetensors"));
  std::set<std::string> shards;
  for (const auto& [name, shard] : index.at("weight_map").items()) {
    shards.insert(shard.get<std::string>());
  }
  int64_t total = 0;
  for (const auto& shard : shards) {
    int64_t shard_bytes = 0;
    const auto tensors = load_safetensors(folder("fp32") + "/" + shard);
    for (const auto& [name, tensor] : tensors) {
      EXPECT_EQ(index.at("weight_map").at(name), shard) << name;
      shard_bytes += tensor.numel() * 4;
    }
    EXPECT_TRUE(shard_bytes <= 8000 || tensors.size() == 1) << shard << ": " << shard_bytes;
    total += shard_bytes;
  }
  EXPECT_EQ(index.at("metadata").at("total_size").get<int64_t>(), total);
  EXPECT_GT(shards.size(), 2u);
  char last[64];
  std::snprintf(last, sizeof(last), "model-%05zu-of-%05zu.safetensors", shards.size(),
                shards.size());
  EXPECT_EQ(*shards.rbegin(), last);
  EXPECT_EQ(index.at("weight_map").count("lm_head.weight"), 0u);

  // bf16: each tensor stored rounded to nearest, read back as those values in fp32.
  export_hf_decoder(weights, config, "llama", folder("fp32"), kHfDefaultMaxShardBytes,
                    at::kBFloat16);
  EXPECT_FALSE(fs::exists(folder("fp32") + "/model.safetensors.index.json"))
      << "the earlier export's index is removed with its shards";
  EXPECT_FALSE(fs::exists(folder("fp32") + "/" + *shards.begin()));
  EXPECT_EQ(read_json(folder("fp32") + "/config.json").at("torch_dtype"), "bfloat16");
  for (const auto& [name, tensor] : load_safetensors(folder("fp32") + "/model.safetensors")) {
    EXPECT_EQ(tensor.scalar_type(), at::kBFloat16) << name;
  }
  bool rounded = false;
  for (const auto& [name, tensor] :
       read_hf_decoder_weights(folder("fp32"), read_hf_decoder_config(folder("fp32")))) {
    EXPECT_TRUE(torch::equal(tensor, weights.at(name).to(at::kBFloat16).to(at::kFloat))) << name;
    rounded |= !torch::equal(tensor, weights.at(name));
  }
  EXPECT_TRUE(rounded);
}

TEST_F(HfDecoder, ARankReadsOnlyItsTensorsAndOpensOnlyTheirShards) {
  Variant variant = exported_variants()[1];  // tied, in shards
  variant.max_shard_bytes = 3000;
  const auto config = config_of(variant);
  const auto weights = export_variant(variant, "shards");
  // The shards holding nothing of block 2 (layer 1) removed: reading block 2 never opens them.
  const auto index = read_json(folder("shards") + "/model.safetensors.index.json");
  std::set<std::string> needed, all;
  for (const auto& [name, shard] : index.at("weight_map").items()) {
    all.insert(shard.get<std::string>());
    if (name.rfind("model.layers.1.", 0) == 0) needed.insert(shard.get<std::string>());
  }
  ASSERT_LT(needed.size(), all.size());
  for (const auto& shard : all) {
    if (needed.count(shard) == 0) fs::remove(folder("shards") + "/" + shard);
  }
  const auto block = read_hf_decoder_weights(
      folder("shards"), config, [](const std::string& name) { return name.rfind("2.", 0) == 0; });
  ASSERT_FALSE(block.empty());
  size_t expected = 0;
  for (const auto& [name, tensor] : weights) expected += name.rfind("2.", 0) == 0 ? 1 : 0;
  EXPECT_EQ(block.size(), expected);
  for (const auto& [name, tensor] : block) EXPECT_TRUE(torch::equal(tensor, weights.at(name)));

  // The tied head comes as the embedding's tensor, under its name; a shard it needs that is gone
  // is named.
  const std::string head = std::to_string(config.n_layer + 2) + ".weight";
  const auto message = invalid_argument_of([&] {
    read_hf_decoder_weights(folder("shards"), config,
                            [&](const std::string& name) { return name == head; });
  });
  expect_mentions(message, {"model-00001-of-", "does not exist"});
  export_variant(variant, "shards");
  const auto tied = read_hf_decoder_weights(folder("shards"), config,
                                            [&](const std::string& name) { return name == head; });
  ASSERT_EQ(tied.size(), 1u);
  EXPECT_TRUE(torch::equal(tied.at("0.weight"), weights.at("0.weight")));
}

TEST_F(HfDecoder, AFolderThatDoesNotFitIsRefusedNamingTheTensorOrKey) {
  const Variant variant = exported_variants()[0];  // llama, untied, one file
  const auto config = config_of(variant);
  export_variant(variant, "good");
  const std::string weights_file = folder("good") + "/model.safetensors";
  const auto stored = load_safetensors(weights_file);
  const auto read_with = [&](const TensorMap& tensors) {
    save_safetensors(weights_file, tensors);
    return invalid_argument_of([&] { read_hf_decoder_weights(folder("good"), config); });
  };

  auto missing = stored;
  missing.erase("model.layers.1.mlp.up_proj.weight");
  expect_mentions(read_with(missing),
                  {"\"model.layers.1.mlp.up_proj.weight\"", weights_file, "[48, 32]"});
  auto extra = stored;
  extra["model.layers.0.self_attn.sinks"] = torch::zeros({4});
  expect_mentions(read_with(extra), {"\"model.layers.0.self_attn.sinks\"", weights_file});
  auto misshaped = stored;
  misshaped["model.layers.0.self_attn.k_proj.weight"] = torch::zeros({32, 32});
  expect_mentions(read_with(misshaped), {"\"model.layers.0.self_attn.k_proj.weight\"", weights_file,
                                         "[32, 32]", "[16, 32]"});
  auto untied = stored;
  untied.erase("lm_head.weight");
  expect_mentions(read_with(untied), {"\"lm_head.weight\"", "tie_word_embeddings is false"});
  auto quantized = stored;
  quantized["model.norm.weight"] = torch::zeros({32}, torch::kInt8);
  expect_mentions(read_with(quantized), {"\"model.norm.weight\"", "not floating point"});
  save_safetensors(weights_file, stored);

  const std::string config_file = folder("good") + "/config.json";
  const Json good = read_json(config_file);
  const auto config_error = [&](const std::function<void(Json&)>& edit) {
    Json edited = good;
    edit(edited);
    write_json(config_file, edited);
    return invalid_argument_of([&] { read_hf_decoder_config(folder("good")); });
  };
  expect_mentions(config_error([](Json& json) { json["model_type"] = "mistral"; }),
                  {config_file, "\"model_type\"", "mistral", "llama", "qwen3"});
  expect_mentions(config_error([](Json& json) { json["model_type"] = "qwen2"; }), {"qwen2"});
  expect_mentions(config_error([](Json& json) {
                    json["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
                  }),
                  {config_file, "\"rope_scaling.rope_type\"", "yarn", "default and llama3"});
  expect_mentions(config_error([](Json& json) {
                    json["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
                  }),
                  {"\"rope_scaling.type\"", "linear"});
  expect_mentions(config_error([](Json& json) {
                    json.erase("rope_theta");
                    json.erase("rope_scaling");
                    json["rope_parameters"] = {{"rope_type", "dynamic"}, {"rope_theta", 1e4}};
                  }),
                  {"\"rope_parameters.rope_type\"", "dynamic"});
  expect_mentions(config_error([](Json& json) { json["rope_scaling"].erase("low_freq_factor"); }),
                  {"\"rope_scaling.low_freq_factor\"", "missing"});
  // Two spellings that disagree (transformers' versions take different ones) are refused.
  expect_mentions(config_error([](Json& json) { json["rope_scaling"]["type"] = "linear"; }),
                  {"\"rope_scaling.type\"", "\"linear\" and rope_type \"llama3\""});
  expect_mentions(config_error([](Json& json) { json["rope_scaling"]["rope_theta"] = 1.0; }),
                  {"\"rope_scaling.rope_theta\"", "disagrees with the top-level rope_theta"});
  expect_mentions(config_error([](Json& json) { json["partial_rotary_factor"] = 0.5; }),
                  {"\"partial_rotary_factor\"", "is not 1"});
  expect_mentions(config_error([](Json& json) { json.erase("hidden_size"); }),
                  {config_file, "\"hidden_size\"", "missing"});
  expect_mentions(config_error([](Json& json) { json["num_hidden_layers"] = "two"; }),
                  {"\"num_hidden_layers\"", "\"two\""});
  expect_mentions(config_error([](Json& json) { json["mlp_bias"] = true; }), {"\"mlp_bias\""});
  expect_mentions(config_error([](Json& json) { json["hidden_act"] = "gelu"; }),
                  {"\"hidden_act\""});
  expect_mentions(config_error([](Json& json) { json["attention_dropout"] = 0.1; }),
                  {"\"attention_dropout\"", "no dropout"});
  // The older "type" key names a kind pipetrain has, and reads as that kind.
  Json legacy = good;
  legacy["rope_scaling"].erase("rope_type");
  legacy["rope_scaling"]["type"] = "llama3";
  write_json(config_file, legacy);
  EXPECT_EQ(read_hf_decoder_config(folder("good")).rope.rope_type(), "llama3");

  expect_mentions(invalid_argument_of([&] { read_hf_decoder_config(folder("nothing")); }),
                  {"no config.json"});
  fs::remove(weights_file);
  expect_mentions(invalid_argument_of([&] { read_hf_decoder_weights(folder("good"), config); }),
                  {"model.safetensors.index.json"});
}

TEST_F(HfDecoder, AnExportRefusesWeightsOfAnotherShapeBeforeWritingAnything) {
  const Variant variant = exported_variants()[0];
  const auto config = config_of(variant);
  const auto weights = weights_of(random_decoder(config, 3));
  const auto refused = [&](const Weights& these, const nn::DecoderConfig& shape,
                           const std::string& model_type) {
    const auto message = invalid_argument_of(
        [&] { export_hf_decoder(these, shape, model_type, folder("refused"), 1 << 20); });
    EXPECT_FALSE(fs::exists(folder("refused")));
    return message;
  };
  auto missing = weights;
  missing.erase("1.self_attn.v_proj.weight");
  expect_mentions(refused(missing, config, "llama"), {"\"1.self_attn.v_proj.weight\""});
  auto extra = weights;
  extra["1.self_attn.q_norm.weight"] = torch::ones({8});
  expect_mentions(refused(extra, config, "llama"), {"\"1.self_attn.q_norm.weight\""});
  auto misshaped = weights;
  misshaped["3.weight"] = torch::ones({16});
  expect_mentions(refused(misshaped, config, "llama"), {"\"3.weight\"", "[16]", "[32]"});
  expect_mentions(refused(weights, config, "qwen3"), {"qwen3", "qk_norm"});
  expect_mentions(refused(weights, config, "mistral"), {"mistral"});
}

TEST_F(HfDecoder, AnExportCarriesTheTokenizerOfItsSourceFolder) {
  const Variant variant = exported_variants()[2];  // qwen3
  const auto config = config_of(variant);
  const auto weights = weights_of(random_decoder(config, 5));
  const std::string source = folder("source");
  fs::create_directories(source);
  const std::map<std::string, std::string> files{
      {"tokenizer.json", R"({"model": {"type": "BPE"}})"},
      {"tokenizer_config.json", R"({"eos_token": "<|im_end|>"})"},
      {"generation_config.json", R"({"bos_token_id": 1, "eos_token_id": [2, 3], "top_p": 0.9})"},
      {"merges.txt", "a b\n"}};
  for (const auto& [name, text] : files) std::ofstream(source + "/" + name) << text;
  write_json(source + "/config.json", {{"bos_token_id", 1}, {"eos_token_id", {2, 3}}});
  export_hf_decoder(weights, config, "qwen3", folder("out"), kHfDefaultMaxShardBytes, at::kBFloat16,
                    source);
  for (const auto& [name, text] : files) {
    std::ifstream in(folder("out") + "/" + name);
    const std::string copied{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    EXPECT_EQ(copied, text) << name;
  }
  const auto exported = read_json(folder("out") + "/config.json");
  EXPECT_EQ(exported.at("architectures"), Json::array({"Qwen3ForCausalLM"}));
  EXPECT_EQ(exported.at("bos_token_id"), 1);
  EXPECT_EQ(exported.at("eos_token_id"), Json::array({2, 3}));
  EXPECT_EQ(exported.at("head_dim"), 16);
  EXPECT_TRUE(exported.at("rope_scaling").is_null());

  // Without a source, a minimal generation_config.json, as save_pretrained writes one.
  export_hf_decoder(weights, config, "qwen3", folder("bare"));
  EXPECT_EQ(read_json(folder("bare") + "/generation_config.json"),
            Json::parse(R"({"_from_model_config": true})"));
  EXPECT_FALSE(fs::exists(folder("bare") + "/tokenizer.json"));

  // A source folder of weights alone: nothing to copy, its token ids still kept.
  fs::remove(source + "/tokenizer.json");
  fs::remove(source + "/merges.txt");
  export_hf_decoder(weights, config, "qwen3", folder("none"), kHfDefaultMaxShardBytes,
                    at::kBFloat16, source);
  EXPECT_FALSE(fs::exists(folder("none") + "/tokenizer.json"));
  EXPECT_EQ(read_json(folder("none") + "/config.json").at("bos_token_id"), 1);
}

}  // namespace
}  // namespace pipetrain::testing::hf_decoder_test
