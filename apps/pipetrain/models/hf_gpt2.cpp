#include "models/hf_gpt2.h"

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <pipetrain/file_writer.h>
#include <pipetrain/safetensors.h>

namespace pipetrain::cli {
namespace {

namespace fs = std::filesystem;

// pipetrain's name -> (Hugging Face's name, stored transposed) for one GPT-2 of n_layer blocks.
std::map<std::string, std::pair<std::string, bool>> name_map(int64_t n_layer) {
  std::map<std::string, std::pair<std::string, bool>> names{
      {"0.wte.weight", {"transformer.wte.weight", false}},
      {"0.wpe.weight", {"transformer.wpe.weight", false}},
      {std::to_string(n_layer + 1) + ".weight", {"transformer.ln_f.weight", false}},
      {std::to_string(n_layer + 1) + ".bias", {"transformer.ln_f.bias", false}}};
  for (int64_t i = 0; i < n_layer; ++i) {
    const std::string ours = std::to_string(i + 1) + ".",
                      theirs = "transformer.h." + std::to_string(i) + ".";
    for (const char* norm : {"ln_1", "ln_2"}) {
      for (const char* part : {".weight", ".bias"}) {
        names[ours + norm + part] = {theirs + norm + part, false};
      }
    }
    for (const char* linear : {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}) {
      names[ours + linear + ".weight"] = {theirs + linear + ".weight", true};  // Conv1D: [in, out]
      names[ours + linear + ".bias"] = {theirs + linear + ".bias", false};
    }
  }
  return names;
}

std::string shape_of(const at::Tensor& tensor) {
  std::ostringstream out;
  out << tensor.sizes();
  return out.str();
}

}  // namespace

Gpt2Config gpt2_config_of(const std::map<std::string, at::Tensor>& weights, int64_t n_head) {
  const auto wte = weights.find("0.wte.weight"), wpe = weights.find("0.wpe.weight");
  if (wte == weights.end() || wpe == weights.end()) {
    throw std::invalid_argument(
        "these weights are not a GPT-2 of --model gpt2 (no 0.wte.weight and 0.wpe.weight)");
  }
  Gpt2Config config;
  config.vocab_size = wte->second.size(0);
  config.n_embd = wte->second.size(1);
  config.block_size = wpe->second.size(0);
  config.n_layer = 0;
  while (weights.count(std::to_string(config.n_layer + 1) + ".attn.c_attn.weight") > 0) {
    ++config.n_layer;
  }
  config.n_head = n_head;
  if (n_head == 0) {
    for (const char* size : {"124M", "350M", "774M", "1558M"}) {
      const Gpt2Config preset = gpt2_preset(size);
      if (preset.n_layer == config.n_layer && preset.n_embd == config.n_embd) {
        config.n_head = preset.n_head;
      }
    }
  }
  if (config.n_head == 0) {
    throw std::invalid_argument("a GPT-2 of " + std::to_string(config.n_layer) +
                                " blocks of width " + std::to_string(config.n_embd) +
                                " is no released size, so its heads are unknown: pass --n-head");
  }
  return config;
}

void export_hf_gpt2(const std::map<std::string, at::Tensor>& weights, const Gpt2Config& config,
                    const std::string& dir) {
  const Gpt2Config expected_shapes = config;
  auto reference = make_gpt2(expected_shapes);  // only for the shapes each name must have
  const auto shapes = reference->named_parameters();
  TensorMap out;
  for (const auto& [ours, theirs] : name_map(config.n_layer)) {
    const auto found = weights.find(ours);
    if (found == weights.end()) {
      throw std::invalid_argument("the checkpoint has no " + ours + ", which GPT-2 of " +
                                  std::to_string(config.n_layer) + " blocks needs");
    }
    if (found->second.sizes() != shapes[ours].sizes()) {
      throw std::invalid_argument(ours + " has shape " + shape_of(found->second) + ", not " +
                                  shape_of(shapes[ours]) + " as this GPT-2's shape says");
    }
    const auto tensor = found->second.to(torch::kFloat32);
    out[theirs.first] = (theirs.second ? tensor.t() : tensor).contiguous();
  }
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) throw std::runtime_error("cannot create " + dir + ": " + error.message());
  save_safetensors((fs::path(dir) / "model.safetensors").string(), out, {{"format", "pt"}});
  const nlohmann::json json{{"architectures", {"GPT2LMHeadModel"}},
                            {"model_type", "gpt2"},
                            {"vocab_size", config.vocab_size},
                            {"n_positions", config.block_size},
                            {"n_ctx", config.block_size},
                            {"n_embd", config.n_embd},
                            {"n_layer", config.n_layer},
                            {"n_head", config.n_head},
                            {"n_inner", nullptr},
                            {"activation_function", "gelu_new"},
                            {"resid_pdrop", 0.0},
                            {"embd_pdrop", 0.0},
                            {"attn_pdrop", 0.0},
                            {"layer_norm_epsilon", 1e-5},
                            {"initializer_range", 0.02},
                            {"tie_word_embeddings", true},
                            {"bos_token_id", 50256},
                            {"eos_token_id", 50256}};
  write_file((fs::path(dir) / "config.json").string(), json.dump(2) + "\n");
}

std::pair<Gpt2Config, std::map<std::string, at::Tensor>> read_hf_gpt2(const std::string& dir) {
  const auto config_path = (fs::path(dir) / "config.json").string();
  std::ifstream in(config_path);
  if (!in) {
    throw std::invalid_argument("--init-from " + dir +
                                ": no config.json there (a folder written "
                                "by save_pretrained or pipetrain export)");
  }
  Gpt2Config config;
  try {
    const auto json = nlohmann::json::parse(in);
    if (json.value("model_type", "") != "gpt2") {
      throw std::invalid_argument("model_type is '" + json.value("model_type", "") + "', not gpt2");
    }
    config.n_layer = json.at("n_layer").get<int64_t>();
    config.n_head = json.at("n_head").get<int64_t>();
    config.n_embd = json.at("n_embd").get<int64_t>();
    config.block_size = json.at("n_positions").get<int64_t>();
    config.vocab_size = json.at("vocab_size").get<int64_t>();
    if (!json.value("n_inner", nlohmann::json()).is_null() ||
        json.value("activation_function", "gelu_new") != "gelu_new") {
      throw std::invalid_argument("only GPT-2's own MLP (4 n_embd, gelu_new) is built");
    }
  } catch (const std::exception& e) {
    throw std::invalid_argument(config_path + ": " + e.what());
  }
  const auto weights_path = (fs::path(dir) / "model.safetensors").string();
  const TensorMap stored = load_safetensors(weights_path);
  std::map<std::string, at::Tensor> weights;
  for (const auto& [ours, theirs] : name_map(config.n_layer)) {
    // Hub files of the base model leave out the "transformer." prefix.
    auto found = stored.find(theirs.first);
    if (found == stored.end())
      found = stored.find(theirs.first.substr(std::string("transformer.").size()));
    if (found == stored.end()) {
      throw std::invalid_argument(weights_path + " has no " + theirs.first + " (GPT-2 of " +
                                  std::to_string(config.n_layer) + " blocks, config.json)");
    }
    weights[ours] = theirs.second ? found->second.t().contiguous() : found->second;
  }
  return {config, weights};
}

}  // namespace pipetrain::cli
