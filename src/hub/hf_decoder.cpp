#include "pipetrain/hf_decoder.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <sstream>
#include <stdexcept>

#include "hub/hf_layers.h"
#include "io/file_writer.h"
#include "io/hf_json.h"

namespace pipetrain {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

bool ends_with(const std::string& text, const std::string& end) {
  return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
}

std::string shape_text(at::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

// The shape in words, for messages about tensors that do not fit it.
std::string shape_words(const nn::DecoderConfig& config) {
  return std::to_string(config.n_layer) + " layers of width " + std::to_string(config.n_embd) +
         ", " + std::to_string(config.n_head) + " heads (" + std::to_string(config.kv_heads()) +
         " key/value) of " + std::to_string(config.head_size()) + " features" +
         (config.qk_norm ? ", q/k norms" : "") +
         (config.attention_bias ? ", attention biases" : "") +
         (config.tie_word_embeddings ? ", the head tied to the embedding" : ", a head of its own");
}

// The RoPE of a config.json: transformers 5's rope_parameters when there, else transformers 4's
// top-level rope_theta and rope_scaling (null: the default kind).
nn::RotaryEmbeddingOptions read_rope(const JsonFields& config, const std::string& path) {
  nn::RotaryEmbeddingOptions rope;
  const Json* scaling = nullptr;
  std::string where;
  double theta = config.number("rope_theta", 10000.0);
  if (config.has("rope_parameters")) {
    scaling = &config.at("rope_parameters");
    where = "rope_parameters";
    // Per layer type, as transformers 5 may nest it; these models' layers are all full attention.
    if (scaling->is_object() && scaling->contains("full_attention") &&
        scaling->at("full_attention").is_object()) {
      scaling = &scaling->at("full_attention");
      where += ".full_attention";
    }
  } else if (config.has("rope_scaling")) {
    scaling = &config.at("rope_scaling");
    where = "rope_scaling";
  }
  // Where two spellings of one setting disagree, which one a reader takes differs between
  // transformers' versions: refused rather than picked.
  if (config.number("partial_rotary_factor", 1.0) != 1.0) {
    config.fail("partial_rotary_factor", "is not 1: pipetrain rotates every feature of a head");
  }
  if (scaling == nullptr) return rope.theta(theta);
  if (!scaling->is_object()) {
    config.fail(where, "is " + scaling->dump() + ", not an object");
  }
  const JsonFields fields(path, *scaling, where + ".");
  if (where == "rope_scaling" && fields.has("rope_theta") && config.has("rope_theta") &&
      fields.number("rope_theta") != theta) {
    fields.fail("rope_theta", "disagrees with the top-level rope_theta: make them agree");
  }
  theta = fields.number("rope_theta", theta);
  if (fields.has("rope_type") && fields.has("type") &&
      fields.string("rope_type") != fields.string("type")) {
    fields.fail("type", "is \"" + fields.string("type") + "\" and rope_type \"" +
                            fields.string("rope_type") + "\": make them agree");
  }
  const std::string kind =
      fields.has("rope_type") ? fields.string("rope_type") : fields.string("type", "default");
  if (kind != "default" && kind != "llama3") {
    fields.fail(fields.has("rope_type") ? "rope_type" : "type",
                "is \"" + kind +
                    "\", a RoPE scaling pipetrain does not implement: it has default and llama3 "
                    "(Llama 3.1's), not yarn, dynamic, linear or longrope");
  }
  if (fields.number("partial_rotary_factor", 1.0) != 1.0) {
    fields.fail("partial_rotary_factor", "is not 1: pipetrain rotates every feature of a head");
  }
  rope.theta(theta).rope_type(kind);
  if (kind == "llama3") {
    rope.factor(fields.number("factor"))
        .low_freq_factor(fields.number("low_freq_factor"))
        .high_freq_factor(fields.number("high_freq_factor"))
        .original_max_position_embeddings(fields.integer("original_max_position_embeddings"));
  }
  return rope;
}

std::string dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return "float32";
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    default:
      throw std::invalid_argument(std::string("a Hugging Face export is bf16, fp16 or fp32, not ") +
                                  c10::toString(dtype));
  }
}

Json config_json(const nn::DecoderConfig& config, const std::string& model_type,
                 at::ScalarType dtype, const Json& token_ids) {
  const bool qwen3 = model_type == "qwen3";
  Json rope_scaling = nullptr;
  if (config.rope.rope_type() == "llama3") {
    rope_scaling = {
        {"rope_type", "llama3"},
        {"factor", config.rope.factor()},
        {"low_freq_factor", config.rope.low_freq_factor()},
        {"high_freq_factor", config.rope.high_freq_factor()},
        {"original_max_position_embeddings", config.rope.original_max_position_embeddings()}};
  }
  Json json{
      {"architectures", Json::array({qwen3 ? "Qwen3ForCausalLM" : "LlamaForCausalLM"})},
      {"model_type", model_type},
      {"attention_bias", config.attention_bias},
      {"attention_dropout", 0.0},
      {"head_dim", config.head_size()},
      {"hidden_act", "silu"},
      {"hidden_size", config.n_embd},
      {"initializer_range", config.init_std},
      {"intermediate_size", config.intermediate_size},
      {"max_position_embeddings",
       config.max_position_embeddings > 0 ? config.max_position_embeddings : config.block_size},
      {"num_attention_heads", config.n_head},
      {"num_hidden_layers", config.n_layer},
      {"num_key_value_heads", config.kv_heads()},
      {"rms_norm_eps", config.rms_norm_eps},
      {"rope_scaling", rope_scaling},
      {"rope_theta", config.rope.theta()},
      {"tie_word_embeddings", config.tie_word_embeddings},
      {"torch_dtype", dtype_name(dtype)},
      {"use_cache", true},
      {"vocab_size", config.vocab_size}};
  if (qwen3) {
    json["use_sliding_window"] = false;
    json["sliding_window"] = nullptr;
    json["max_window_layers"] = config.n_layer;
  } else {
    json["mlp_bias"] = false;
    json["pretraining_tp"] = 1;
  }
  json.update(token_ids);
  return json;
}

}  // namespace

nn::DecoderConfig read_hf_decoder_config(const std::string& dir, std::string* model_type_out,
                                         std::string* dtype_out) {
  const fs::path path = fs::path(dir) / "config.json";
  if (!fs::is_regular_file(path)) {
    throw std::invalid_argument(dir +
                                " has no config.json: pass a Hugging Face model folder (one "
                                "save_pretrained or `pipetrain export` wrote)");
  }
  const Json json = read_json_object(path.string());
  const JsonFields fields(path.string(), json);
  const std::string model_type = fields.string("model_type");
  if (model_type != "llama" && model_type != "qwen3") {
    fields.fail("model_type", "is \"" + model_type +
                                  "\", a model pipetrain does not build: it reads llama (Llama 3) "
                                  "and qwen3 (Qwen3)");
  }
  const bool qwen3 = model_type == "qwen3";
  if (fields.string("hidden_act", "silu") != "silu") {
    fields.fail("hidden_act", "is not silu: pipetrain's decoder MLP is SwiGLU");
  }
  if (fields.boolean("mlp_bias", false)) {
    fields.fail("mlp_bias", "is true: pipetrain's decoder MLP has no biases");
  }
  // transformers applies it while training; fit would train without it.
  if (fields.number("attention_dropout", 0.0) != 0.0) {
    fields.fail("attention_dropout", "is not 0: pipetrain's decoder attention has no dropout");
  }
  if (fields.boolean("use_sliding_window", false)) {
    fields.fail("use_sliding_window", "is true: pipetrain's attention has no sliding window");
  }
  if (fields.has("layer_types")) {
    if (!fields.at("layer_types").is_array()) fields.fail("layer_types", "is not a list");
    for (const auto& layer_type : fields.at("layer_types")) {
      if (layer_type != "full_attention") {
        fields.fail("layer_types", "holds " + layer_type.dump() +
                                       ": pipetrain's attention is full attention in every layer");
      }
    }
  }

  nn::DecoderConfig config;
  config.qk_norm = qwen3;
  config.n_embd = fields.integer("hidden_size");
  config.n_layer = fields.integer("num_hidden_layers");
  config.n_head = fields.integer("num_attention_heads");
  // transformers' defaults for keys a config.json may leave out (LlamaConfig, Qwen3Config).
  config.n_kv_head = fields.integer("num_key_value_heads", qwen3 ? 32 : config.n_head);
  const int64_t default_head_dim = config.n_head > 0 ? config.n_embd / config.n_head : 0;
  config.head_dim = fields.integer("head_dim", qwen3 ? 128 : default_head_dim);
  config.intermediate_size = fields.integer("intermediate_size");
  config.vocab_size = fields.integer("vocab_size");
  config.max_position_embeddings = fields.integer("max_position_embeddings", qwen3 ? 32768 : 2048);
  // The sequence length trained on is the command's to choose, up to the model's positions.
  config.block_size = std::min(config.block_size, config.max_position_embeddings);
  config.rms_norm_eps = fields.number("rms_norm_eps", 1e-6);
  config.tie_word_embeddings = fields.boolean("tie_word_embeddings", false);
  config.attention_bias = fields.boolean("attention_bias", false);
  config.init_std = fields.number("initializer_range", 0.02);
  config.rope = read_rope(fields, path.string());
  try {
    nn::check_decoder_config(config);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(path.string() +
                                " describes no decoder pipetrain builds: " + e.what());
  }
  if (model_type_out != nullptr) *model_type_out = model_type;
  if (dtype_out != nullptr) {
    *dtype_out =
        fields.has("torch_dtype") ? fields.string("torch_dtype") : fields.string("dtype", "");
  }
  return config;
}

namespace {

// Refuses a folder whose listing is not the tensors of a decoder of shape `config`: one missing,
// or one `config` has no place for (checked by name: no tensor is read).
void check_listing(const HfFolder& folder, const nn::DecoderConfig& config,
                   const std::vector<HfTensor>& tensors) {
  std::set<std::string> known;
  for (const auto& tensor : tensors) known.insert(tensor.hf_name);
  for (const auto& [name, file] : folder.file_of()) {
    // transformers passes over these too: a tied folder's own head, and the RoPE frequencies older
    // files saved as buffers.
    const bool passed_over = (config.tie_word_embeddings && name == "lm_head.weight") ||
                             ends_with(name, ".rotary_emb.inv_freq");
    if (known.count(name) == 0 && !passed_over) {
      throw std::invalid_argument(
          folder.listing() + " holds tensor \"" + name +
          "\", which the model of its config.json (" + shape_words(config) +
          ") has no place for: the weights are of another model or variant than config.json "
          "describes; use the config.json written with them");
    }
  }
  for (const auto& tensor : tensors) {
    if (!folder.contains(tensor.hf_name)) {
      throw std::invalid_argument(
          folder.listing() + " has no tensor \"" + tensor.hf_name + "\" (shape " +
          shape_text(tensor.shape) + "), which the model of its config.json (" +
          shape_words(config) +
          ") needs: the folder is incomplete, or its config.json is not the one written with "
          "the weights" +
          (tensor.hf_name == "lm_head.weight" ? " (tie_word_embeddings is false)" : ""));
    }
  }
}

// Refuses a tensor `file` holds as `dtype` of `sizes` where the decoder of shape `config` has
// `tensor`.
void check_stored_tensor(const std::string& file, const HfTensor& tensor, at::ScalarType dtype,
                         at::IntArrayRef sizes, const nn::DecoderConfig& config) {
  if (!at::isFloatingType(dtype)) {
    throw std::invalid_argument(file + ": tensor \"" + tensor.hf_name + "\" is " +
                                c10::toString(dtype) +
                                ", not floating point (fp32, bf16 or fp16): quantized weights are "
                                "not read; use the unquantized model");
  }
  if (sizes != at::IntArrayRef(tensor.shape)) {
    throw std::invalid_argument(file + ": tensor \"" + tensor.hf_name + "\" has shape " +
                                shape_text(sizes) + ", not the " + shape_text(tensor.shape) +
                                " the model of config.json (" + shape_words(config) +
                                ") has there: use the config.json written with these weights");
  }
}

}  // namespace

std::vector<HfTensor> hf_decoder_tensors(const nn::DecoderConfig& config) {
  const int64_t width = config.n_embd, head_dim = config.head_size();
  const int64_t q_width = config.n_head * head_dim, kv_width = config.kv_heads() * head_dim;
  std::vector<HfTensor> tensors{
      {"0.weight", "model.embed_tokens.weight", {config.vocab_size, width}}};
  for (int64_t layer = 0; layer < config.n_layer; ++layer) {
    const std::string ours = std::to_string(layer + 1) + ".",
                      theirs = "model.layers." + std::to_string(layer) + ".";
    const auto add = [&](const std::string& name, std::vector<int64_t> shape) {
      tensors.push_back({ours + name, theirs + name, std::move(shape)});
    };
    const auto linear = [&](const std::string& name, int64_t out, int64_t in, bool bias) {
      add(name + ".weight", {out, in});
      if (bias) add(name + ".bias", {out});
    };
    // LlamaAttention and Qwen3Attention give o_proj a bias too when attention_bias is set.
    linear("self_attn.q_proj", q_width, width, config.attention_bias);
    linear("self_attn.k_proj", kv_width, width, config.attention_bias);
    linear("self_attn.v_proj", kv_width, width, config.attention_bias);
    linear("self_attn.o_proj", width, q_width, config.attention_bias);
    if (config.qk_norm) {
      add("self_attn.q_norm.weight", {head_dim});
      add("self_attn.k_norm.weight", {head_dim});
    }
    linear("mlp.gate_proj", config.intermediate_size, width, false);
    linear("mlp.up_proj", config.intermediate_size, width, false);
    linear("mlp.down_proj", width, config.intermediate_size, false);
    add("input_layernorm.weight", {width});
    add("post_attention_layernorm.weight", {width});
  }
  tensors.push_back({std::to_string(config.n_layer + 1) + ".weight", "model.norm.weight", {width}});
  if (!config.tie_word_embeddings) {
    tensors.push_back({std::to_string(config.n_layer + 2) + ".weight",
                       "lm_head.weight",
                       {config.vocab_size, width}});
  }
  return tensors;
}

void check_hf_decoder_weights(const std::string& dir, const nn::DecoderConfig& config) {
  check_hf_decoder_weights(HfFolder(dir), config);
}

void check_hf_decoder_weights(const HfFolder& folder, const nn::DecoderConfig& config) {
  const auto tensors = hf_decoder_tensors(config);
  check_listing(folder, config, tensors);
  for (const auto& tensor : tensors) {
    const SafetensorsEntry entry = folder.entry(tensor.hf_name);
    check_stored_tensor(folder.file_of().at(tensor.hf_name), tensor, entry.dtype, entry.shape,
                        config);
  }
}

std::map<std::string, at::Tensor> read_hf_decoder_weights(
    const std::string& dir, const nn::DecoderConfig& config,
    const std::function<bool(const std::string& pipetrain_name)>& wanted) {
  return read_hf_decoder_weights(HfFolder(dir), config, wanted);
}

std::map<std::string, at::Tensor> read_hf_decoder_weights(
    const HfFolder& folder, const nn::DecoderConfig& config,
    const std::function<bool(const std::string& pipetrain_name)>& wanted) {
  const auto tensors = hf_decoder_tensors(config);
  check_listing(folder, config, tensors);
  const std::string tied_head = std::to_string(config.n_layer + 2) + ".weight";
  const auto is_wanted = [&](const HfTensor& tensor) {
    if (!wanted) return true;
    return wanted(tensor.name) ||
           (config.tie_word_embeddings && tensor.name == "0.weight" && wanted(tied_head));
  };
  // Only the files holding a tensor wanted are opened, and only those tensors read.
  std::vector<HfTensor> wanted_tensors;
  std::set<std::string> names;
  for (const auto& tensor : tensors) {
    if (!is_wanted(tensor)) continue;
    wanted_tensors.push_back(tensor);
    names.insert(tensor.hf_name);
  }
  const TensorMap stored = folder.read(names);
  std::map<std::string, at::Tensor> weights;
  for (const auto& tensor : wanted_tensors) {
    const at::Tensor& value = stored.at(tensor.hf_name);
    check_stored_tensor(folder.file_of().at(tensor.hf_name), tensor, value.scalar_type(),
                        value.sizes(), config);
    weights[tensor.name] = value.to(at::kFloat).contiguous();
  }
  return weights;
}

std::vector<LayerSpec> hf_decoder_layers(const nn::DecoderConfig& config,
                                         const std::string& init_from) {
  if (init_from.empty()) return nn::decoder_layers(config);
  return hf_decoder_layers(config, std::make_shared<const HfFolder>(init_from));
}

std::vector<LayerSpec> hf_decoder_layers(const nn::DecoderConfig& config,
                                         std::shared_ptr<const HfFolder> folder) {
  return layers_read_from(nn::decoder_layers(config), folder->dir(),
                          [config, folder](const auto& wanted) {
                            return read_hf_decoder_weights(*folder, config, wanted);
                          });
}

void export_hf_decoder(const std::map<std::string, at::Tensor>& weights,
                       const nn::DecoderConfig& config, const std::string& model_type,
                       const std::string& dir, int64_t max_shard_bytes, at::ScalarType dtype,
                       const std::string& tokenizer_from) {
  export_hf_decoder(WeightSource::of(weights), config, model_type, dir, max_shard_bytes, dtype,
                    tokenizer_from);
}

void export_hf_decoder(const WeightSource& weights, const nn::DecoderConfig& config,
                       const std::string& model_type, const std::string& dir,
                       int64_t max_shard_bytes, at::ScalarType dtype,
                       const std::string& tokenizer_from) {
  // Everything checked before the first byte is written.
  if (model_type != "llama" && model_type != "qwen3") {
    throw std::invalid_argument("model_type \"" + model_type +
                                "\" is not one pipetrain exports: llama or qwen3");
  }
  if (config.qk_norm != (model_type == "qwen3")) {
    throw std::invalid_argument(
        config.qk_norm ? "a decoder with q/k norms is a qwen3, not a " + model_type
                       : "a qwen3 has q/k norms (qk_norm), which this decoder lacks: export it as "
                         "llama");
  }
  nn::check_decoder_config(config);
  dtype_name(dtype);  // throws for a dtype no export has
  if (max_shard_bytes <= 0) {
    throw std::invalid_argument("the largest shard must be positive, not " +
                                std::to_string(max_shard_bytes) + " bytes");
  }
  const auto tensors = hf_decoder_tensors(config);
  const std::string tied_head = std::to_string(config.n_layer + 2) + ".weight";
  std::set<std::string> expected;
  for (const auto& tensor : tensors) expected.insert(tensor.name);
  for (const auto& [name, shape] : weights.shapes) {
    if (expected.count(name) == 0 && !(config.tie_word_embeddings && name == tied_head)) {
      throw std::invalid_argument("the weights hold \"" + name + "\", which a " + model_type +
                                  " of " + shape_words(config) +
                                  " has no place for: they are of another shape or model");
    }
  }
  // A head of its own written as tied would be dropped, and the folder would say another model.
  const bool both = weights.shapes.count(tied_head) && weights.shapes.count("0.weight");
  const auto pair = config.tie_word_embeddings && both ? weights.read({tied_head, "0.weight"})
                                                       : std::map<std::string, at::Tensor>();
  if (!pair.empty() && (pair.at(tied_head).sizes() != pair.at("0.weight").sizes() ||
                        !pair.at(tied_head).equal(pair.at("0.weight")))) {
    throw std::invalid_argument("the weights' head \"" + tied_head +
                                "\" is not the token embedding \"0.weight\", but the shape to "
                                "export has a tied head: the model was trained untied (pass "
                                "--tie-word-embeddings false, as its fit had it)");
  }
  for (const auto& tensor : tensors) {
    const auto found = weights.shapes.find(tensor.name);
    if (found == weights.shapes.end()) {
      throw std::invalid_argument("the weights have no \"" + tensor.name + "\", which a " +
                                  model_type + " of " + shape_words(config) + " needs");
    }
    if (found->second != tensor.shape) {
      throw std::invalid_argument("\"" + tensor.name + "\" has shape " + shape_text(found->second) +
                                  ", not the " + shape_text(tensor.shape) + " of a " + model_type +
                                  " of " + shape_words(config));
    }
  }
  const TokenizerSource tokenizer = read_tokenizer_source(tokenizer_from, config.vocab_size);

  std::error_code error;
  fs::create_directories(dir, error);
  if (error) throw std::runtime_error("cannot create " + dir + ": " + error.message());
  write_hf_weights(weights, tensors, dir, max_shard_bytes, dtype);
  write_file((fs::path(dir) / "config.json").string(),
             config_json(config, model_type, dtype, tokenizer.token_ids).dump(2) + "\n");
  write_tokenizer_files(tokenizer, dir);
}

void write_hf_decoder_config(const nn::DecoderConfig& config, const std::string& model_type,
                             const std::string& dir, const std::string& tokenizer_from) {
  nn::check_decoder_config(config);
  const Json token_ids = read_tokenizer_source(tokenizer_from, config.vocab_size).token_ids;
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) throw std::runtime_error("cannot create " + dir + ": " + error.message());
  write_file((fs::path(dir) / "config.json").string(),
             config_json(config, model_type, at::kFloat, token_ids).dump(2) + "\n");
}

}  // namespace pipetrain
