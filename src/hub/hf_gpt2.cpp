#include "pipetrain/hf_gpt2.h"

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "hub/hf_layers.h"
#include "io/file_writer.h"

namespace pipetrain {
namespace {

namespace fs = std::filesystem;

std::string shape_of(at::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

// The tensors of a GPT-2 of shape `config` as `folder` names them (Hub files of the base model
// leave out the "transformer." prefix), every one there with its shape: checked from the headers,
// no tensor read. Throws std::invalid_argument naming the file and the tensor.
std::vector<HfTensor> stored_tensors(const HfFolder& folder, const nn::Gpt2Config& config) {
  const std::string& weights_path = folder.listing();
  std::vector<HfTensor> tensors = hf_gpt2_tensors(config);
  for (auto& tensor : tensors) {
    std::string name = tensor.hf_name;
    if (!folder.contains(name)) name = name.substr(std::string("transformer.").size());
    if (!folder.contains(name)) {
      throw std::invalid_argument(weights_path + " has no " + tensor.hf_name + " (GPT-2 of " +
                                  std::to_string(config.n_layer) + " blocks, config.json)");
    }
    std::vector<int64_t> shape = tensor.shape;
    if (tensor.transposed) std::reverse(shape.begin(), shape.end());
    const std::vector<int64_t> stored = folder.entry(name).shape;
    if (stored != shape) {
      throw std::invalid_argument(
          weights_path + ": tensor " + name + " has shape " + shape_of(stored) + ", not the " +
          shape_of(shape) + " of the GPT-2 its config.json describes (vocab_size " +
          std::to_string(config.vocab_size) + ", n_positions " + std::to_string(config.block_size) +
          ", n_embd " + std::to_string(config.n_embd) +
          "): use the config.json written with these weights");
    }
    tensor.hf_name = name;
  }
  return tensors;
}

}  // namespace

std::vector<HfTensor> hf_gpt2_tensors(const nn::Gpt2Config& config) {
  const int64_t c = config.n_embd;
  const std::string final_norm = std::to_string(config.n_layer + 1);
  std::vector<HfTensor> tensors{{"0.wte.weight", "transformer.wte.weight", {config.vocab_size, c}},
                                {"0.wpe.weight", "transformer.wpe.weight", {config.block_size, c}}};
  // Linear layers as [out, in]: c_attn C -> 3C, attn.c_proj C -> C, c_fc C -> 4C, mlp.c_proj 4C ->
  // C.
  const std::vector<std::pair<const char*, std::pair<int64_t, int64_t>>> linears{
      {"attn.c_attn", {3 * c, c}},
      {"attn.c_proj", {c, c}},
      {"mlp.c_fc", {4 * c, c}},
      {"mlp.c_proj", {c, 4 * c}}};
  for (int64_t i = 0; i < config.n_layer; ++i) {
    const std::string ours = std::to_string(i + 1) + ".",
                      theirs = "transformer.h." + std::to_string(i) + ".";
    for (const char* norm : {"ln_1", "ln_2"}) {
      for (const char* part : {".weight", ".bias"}) {
        tensors.push_back({ours + norm + part, theirs + norm + part, {c}});
      }
    }
    for (const auto& [linear, out_in] : linears) {
      tensors.push_back({ours + linear + ".weight",
                         theirs + linear + ".weight",
                         {out_in.first, out_in.second},
                         true});
      tensors.push_back({ours + linear + ".bias", theirs + linear + ".bias", {out_in.first}});
    }
  }
  tensors.push_back({final_norm + ".weight", "transformer.ln_f.weight", {c}});
  tensors.push_back({final_norm + ".bias", "transformer.ln_f.bias", {c}});
  return tensors;
}

nn::Gpt2Config gpt2_config_of(const std::map<std::string, at::Tensor>& weights, int64_t n_head) {
  const auto wte = weights.find("0.wte.weight"), wpe = weights.find("0.wpe.weight");
  if (wte == weights.end() || wpe == weights.end()) {
    throw std::invalid_argument(
        "these weights are not a GPT-2 of --model gpt2 (no 0.wte.weight and 0.wpe.weight)");
  }
  nn::Gpt2Config config;
  config.vocab_size = wte->second.size(0);
  config.n_embd = wte->second.size(1);
  config.block_size = wpe->second.size(0);
  config.n_layer = 0;
  while (weights.count(std::to_string(config.n_layer + 1) + ".attn.c_attn.weight") > 0) {
    ++config.n_layer;
  }
  // The heads leave no trace in the tensors (c_attn holds them all side by side), and a released
  // size's count is no guess to make: a run of 12 blocks of 768 may have had 6.
  if (n_head <= 0) {
    throw std::invalid_argument(
        "the heads of a GPT-2 are not in its weights, and no config.json of the run that wrote "
        "them was found (fit writes one in the run's folder, above checkpoints/): pass --n-head as "
        "fit was given it (12 for 124M, 16 for 350M, 20 for 774M, 25 for 1558M)");
  }
  config.n_head = n_head;
  return config;
}

void export_hf_gpt2(const std::map<std::string, at::Tensor>& weights, const nn::Gpt2Config& config,
                    const std::string& dir) {
  const auto tensors = hf_gpt2_tensors(config);
  for (const auto& tensor : tensors) {
    const auto found = weights.find(tensor.name);
    if (found == weights.end()) {
      throw std::invalid_argument("the checkpoint has no " + tensor.name + ", which GPT-2 of " +
                                  std::to_string(config.n_layer) + " blocks needs");
    }
    if (found->second.sizes() != at::IntArrayRef(tensor.shape)) {
      throw std::invalid_argument(tensor.name + " has shape " + shape_of(found->second.sizes()) +
                                  ", not " + shape_of(tensor.shape) +
                                  " as this GPT-2's shape says");
    }
  }
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) throw std::runtime_error("cannot create " + dir + ": " + error.message());
  // One fp32 file, whatever its size, as GPT-2's own releases are.
  write_hf_weights(WeightSource::of(weights), tensors, dir, std::numeric_limits<int64_t>::max(),
                   at::kFloat);
  write_hf_gpt2_config(config, dir);
}

void write_hf_gpt2_config(const nn::Gpt2Config& config, const std::string& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) throw std::runtime_error("cannot create " + dir + ": " + error.message());
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

nn::Gpt2Config read_hf_gpt2_config(const std::string& dir) {
  const auto config_path = (fs::path(dir) / "config.json").string();
  std::ifstream in(config_path);
  if (!in) {
    throw std::invalid_argument("--init-from " + dir +
                                ": no config.json there (a folder written "
                                "by save_pretrained or pipetrain export)");
  }
  nn::Gpt2Config config;
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
    // Settings that change the model's arithmetic, which pipetrain's GPT-2 does not have.
    if (!json.value("tie_word_embeddings", true)) {
      throw std::invalid_argument(
          "tie_word_embeddings is false: pipetrain's GPT-2 ties its head to wte");
    }
    if (!json.value("scale_attn_weights", true) ||
        json.value("scale_attn_by_inverse_layer_idx", false) ||
        json.value("reorder_and_upcast_attn", false)) {
      throw std::invalid_argument(
          "scale_attn_weights false, scale_attn_by_inverse_layer_idx or reorder_and_upcast_attn "
          "true: pipetrain's GPT-2 scales attention by 1/sqrt(head size) alone");
    }
    if (json.value("layer_norm_epsilon", 1e-5) != 1e-5) {
      throw std::invalid_argument("layer_norm_epsilon is " + json.at("layer_norm_epsilon").dump() +
                                  ": pipetrain's GPT-2 normalises with 1e-5");
    }
  } catch (const std::exception& e) {
    throw std::invalid_argument(config_path + ": " + e.what());
  }
  return config;
}

std::map<std::string, at::Tensor> read_hf_gpt2_weights(
    const std::string& dir, const nn::Gpt2Config& config,
    const std::function<bool(const std::string& pipetrain_name)>& wanted) {
  return read_hf_gpt2_weights(HfFolder(dir), config, wanted);
}

std::map<std::string, at::Tensor> read_hf_gpt2_weights(
    const HfFolder& folder, const nn::Gpt2Config& config,
    const std::function<bool(const std::string& pipetrain_name)>& wanted) {
  // Only the wanted tensors read.
  std::vector<HfTensor> tensors;
  std::set<std::string> names;
  for (const auto& tensor : stored_tensors(folder, config)) {
    if (wanted && !wanted(tensor.name)) continue;
    tensors.push_back(tensor);
    names.insert(tensor.hf_name);
  }
  return from_hf_names(folder.read(names), tensors);
}

std::vector<LayerSpec> hf_gpt2_layers(const nn::Gpt2Config& config, const std::string& init_from) {
  if (init_from.empty()) return nn::gpt2_layers(config);
  return hf_gpt2_layers(config, std::make_shared<const HfFolder>(init_from));
}

std::vector<LayerSpec> hf_gpt2_layers(const nn::Gpt2Config& config,
                                      std::shared_ptr<const HfFolder> folder) {
  return layers_read_from(nn::gpt2_layers(config), folder->listing(),
                          [config, folder](const auto& wanted) {
                            return read_hf_gpt2_weights(*folder, config, wanted);
                          });
}

void check_hf_gpt2_weights(const std::string& dir, const nn::Gpt2Config& config) {
  check_hf_gpt2_weights(HfFolder(dir), config);
}

void check_hf_gpt2_weights(const HfFolder& folder, const nn::Gpt2Config& config) {
  stored_tensors(folder, config);
}

}  // namespace pipetrain
