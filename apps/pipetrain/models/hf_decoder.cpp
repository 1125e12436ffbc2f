#include "models/hf_decoder.h"

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>

#include <pipetrain/safetensors.h>
#include "io/file_writer.h"
#include "models/hf_layers.h"

namespace pipetrain::cli {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

// The files of a Hugging Face folder that make up its tokenizer (and its generation defaults),
// copied beside an export. transformers 4.4x+ may keep the chat template in a file of its own.
const char* const kTokenizerFiles[] = {"tokenizer.json",
                                       "tokenizer_config.json",
                                       "special_tokens_map.json",
                                       "tokenizer.model",
                                       "vocab.json",
                                       "merges.txt",
                                       "added_tokens.json",
                                       "chat_template.jinja",
                                       "generation_config.json"};

bool ends_with(const std::string& text, const std::string& end) {
  return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
}

std::string shape_text(at::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

// One stored tensor of a decoder: its name in pipetrain and in Hugging Face's folder, its shape.
struct DecoderTensor {
  std::string ours;
  std::string theirs;
  std::vector<int64_t> shape;
};

// Every tensor a folder stores for a decoder of shape `config`, in transformers' state-dict order
// (the order save_pretrained fills shards in). A tied head is not stored.
std::vector<DecoderTensor> decoder_tensors(const nn::DecoderConfig& config) {
  const int64_t width = config.n_embd, head_dim = config.head_size();
  const int64_t q_width = config.n_head * head_dim, kv_width = config.kv_heads() * head_dim;
  std::vector<DecoderTensor> tensors{
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

// The shape in words, for messages about tensors that do not fit it.
std::string shape_words(const nn::DecoderConfig& config) {
  return std::to_string(config.n_layer) + " layers of width " + std::to_string(config.n_embd) +
         ", " + std::to_string(config.n_head) + " heads (" + std::to_string(config.kv_heads()) +
         " key/value) of " + std::to_string(config.head_size()) + " features" +
         (config.qk_norm ? ", q/k norms" : "") +
         (config.attention_bias ? ", attention biases" : "") +
         (config.tie_word_embeddings ? ", the head tied to the embedding" : ", a head of its own");
}

// The keys of one JSON object of a file, read so that every error names the file and the key.
class JsonFields {
 public:
  JsonFields(std::string file, const Json& object, std::string prefix = "")
      : file_(std::move(file)), object_(object), prefix_(std::move(prefix)) {}

  // Present and not null.
  bool has(const std::string& key) const {
    return object_.contains(key) && !object_.at(key).is_null();
  }
  const Json& at(const std::string& key) const {
    if (!has(key)) fail(key, "is missing: the file is incomplete, or not a Hugging Face model's");
    return object_.at(key);
  }
  int64_t integer(const std::string& key) const {
    const Json& value = at(key);
    // Some configs write whole numbers as floats (8192.0).
    if (value.is_number_integer()) return value.get<int64_t>();
    if (value.is_number_float() && std::floor(value.get<double>()) == value.get<double>()) {
      return static_cast<int64_t>(value.get<double>());
    }
    fail(key, "is " + value.dump() + ", not a whole number");
  }
  int64_t integer(const std::string& key, int64_t fallback) const {
    return has(key) ? integer(key) : fallback;
  }
  double number(const std::string& key) const {
    const Json& value = at(key);
    if (!value.is_number()) fail(key, "is " + value.dump() + ", not a number");
    return value.get<double>();
  }
  double number(const std::string& key, double fallback) const {
    return has(key) ? number(key) : fallback;
  }
  bool boolean(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    const Json& value = at(key);
    if (!value.is_boolean()) fail(key, "is " + value.dump() + ", not true or false");
    return value.get<bool>();
  }
  std::string string(const std::string& key) const {
    const Json& value = at(key);
    if (!value.is_string()) fail(key, "is " + value.dump() + ", not a string");
    return value.get<std::string>();
  }
  std::string string(const std::string& key, const std::string& fallback) const {
    return has(key) ? string(key) : fallback;
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw std::invalid_argument(file_ + ": \"" + prefix_ + key + "\" " + what);
  }

 private:
  std::string file_;
  const Json& object_;
  std::string prefix_;
};

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

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) throw std::runtime_error("cannot read " + path.string());
  return bytes.str();
}

// Parses `path` as a JSON object; std::invalid_argument naming it when it is not one.
Json read_json_object(const fs::path& path) {
  Json json;
  try {
    json = Json::parse(read_text(path));
  } catch (const Json::exception& e) {
    throw std::invalid_argument(path.string() + " is not valid JSON (" + e.what() +
                                "): write it again, or download it again");
  }
  if (!json.is_object()) {
    throw std::invalid_argument(path.string() + " holds a JSON " + json.type_name() +
                                ", not an object");
  }
  return json;
}

// What `tokenizer_from` contributes to an export, read before anything is written.
struct TokenizerSource {
  std::vector<fs::path> files;
  Json token_ids = Json::object();  // bos_token_id, eos_token_id of its config.json
};

// The tokenizer of `tokenizer_from`, for a model of `vocab_size` tokens.
TokenizerSource read_tokenizer_source(const std::string& tokenizer_from, int64_t vocab_size) {
  TokenizerSource source;
  if (tokenizer_from.empty()) return source;
  const fs::path folder(tokenizer_from);
  if (!fs::is_directory(folder)) {
    throw std::invalid_argument("the tokenizer folder " + tokenizer_from +
                                " does not exist: pass the Hugging Face folder of the model "
                                "whose vocabulary this one was trained on");
  }
  for (const char* name : kTokenizerFiles) {
    if (fs::is_regular_file(folder / name)) source.files.push_back(folder / name);
  }
  // A folder of weights alone (save_pretrained of a model made from a config) has none to copy.
  if (fs::is_regular_file(folder / "config.json")) {
    const Json config = read_json_object(folder / "config.json");
    // Another model's tokenizer would turn the exported model's ids into other words.
    if (config.contains("vocab_size") && config.at("vocab_size").is_number_integer() &&
        config.at("vocab_size").get<int64_t>() != vocab_size) {
      throw std::invalid_argument(
          "the tokenizer folder " + tokenizer_from + " is of a model of " +
          std::to_string(config.at("vocab_size").get<int64_t>()) +
          " tokens (its config.json), and this one has " + std::to_string(vocab_size) +
          ": pass the folder the model was trained from with --init-from, or leave it out");
    }
    for (const char* key : {"bos_token_id", "eos_token_id"}) {
      if (config.contains(key)) source.token_ids[key] = config.at(key);
    }
  }
  return source;
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

// Tensors of `bytes` each split into shards (their indices) as save_pretrained splits a state dict:
// in order, a new shard when the next tensor would take the current one past `max_bytes`; a
// tensor larger than that alone.
std::vector<std::vector<size_t>> plan_shards(const std::vector<int64_t>& bytes, int64_t max_bytes) {
  std::vector<std::vector<size_t>> shards;
  int64_t current = 0;
  bool open = false;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] > max_bytes) {
      shards.push_back({i});
      open = false;
      continue;
    }
    if (!open || current + bytes[i] > max_bytes) {
      shards.emplace_back();
      current = 0;
      open = true;
    }
    shards.back().push_back(i);
    current += bytes[i];
  }
  return shards;
}

std::string shard_name(size_t index, size_t count) {
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

bool is_weight_file(const std::string& name) {
  static const std::regex kShard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return name == kSingleFile || name == kIndexFile || std::regex_match(name, kShard);
}

// Weight files an earlier export may have left in `dir` that this one did not write: transformers
// would read a stale model.safetensors before a new index.
void remove_stale_weight_files(const fs::path& dir, const std::set<std::string>& written) {
  std::vector<fs::path> stale;  // listed first: a folder is not changed while it is read
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (is_weight_file(name) && written.count(name) == 0) stale.push_back(entry.path());
  }
  for (const auto& path : stale) {
    std::error_code error;
    fs::remove(path, error);
    if (error) {
      throw std::runtime_error("cannot remove " + path.string() + " of an earlier export (" +
                               error.message() +
                               "): remove it, or transformers may read it instead");
    }
  }
}

}  // namespace

std::map<std::string, SafetensorsEntry> read_weights_header(const std::string& path) {
  try {
    return read_safetensors_header(path);
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(e.what());
  }
}

bool is_export_file(const std::string& name) {
  // The atomic writer's temporary files: "<name>.tmp-<pid>".
  const auto temporary = name.rfind(".tmp-");
  if (temporary != std::string::npos) return is_export_file(name.substr(0, temporary));
  if (name == "config.json" || is_weight_file(name)) return true;
  return std::find(std::begin(kTokenizerFiles), std::end(kTokenizerFiles), name) !=
         std::end(kTokenizerFiles);
}

nn::DecoderConfig read_hf_decoder_config(const std::string& dir, std::string* model_type_out,
                                         std::string* dtype_out) {
  const fs::path path = fs::path(dir) / "config.json";
  if (!fs::is_regular_file(path)) {
    throw std::invalid_argument(dir +
                                " has no config.json: pass a Hugging Face model folder (one "
                                "save_pretrained or `pipetrain export` wrote)");
  }
  const Json json = read_json_object(path);
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

// Where each tensor of a decoder folder is (Hugging Face's name -> its file), and the file whose
// listing says so (for messages).
struct FolderListing {
  std::map<std::string, std::string> file_of;
  std::string listing;
};

// The folder's listing of a decoder of shape `config`, every tensor of that shape in it and
// nothing else (checked by name: no tensor is read).
FolderListing list_decoder_folder(const std::string& dir, const nn::DecoderConfig& config,
                                  const std::vector<DecoderTensor>& tensors) {
  const fs::path folder(dir);
  std::map<std::string, std::string> file_of;
  std::string listing;
  // A single file first, as transformers looks for it first.
  if (fs::is_regular_file(folder / kSingleFile)) {
    listing = (folder / kSingleFile).string();
    for (const auto& [name, entry] : read_weights_header(listing)) file_of[name] = listing;
  } else if (fs::is_regular_file(folder / kIndexFile)) {
    listing = (folder / kIndexFile).string();
    const Json index = read_json_object(listing);
    const JsonFields fields(listing, index);
    const Json& weight_map = fields.at("weight_map");
    if (!weight_map.is_object()) fields.fail("weight_map", "is not an object");
    for (const auto& [name, shard] : weight_map.items()) {
      // A shard is a file beside the index: no path may lead out of the folder.
      if (!shard.is_string() || shard.get<std::string>().empty() ||
          shard.get<std::string>().find('/') != std::string::npos ||
          shard.get<std::string>() == "..") {
        fields.fail("weight_map", "gives tensor \"" + name + "\" the file " + shard.dump() +
                                      ", not the name of a file beside the index");
      }
      file_of[name] = (folder / shard.get<std::string>()).string();
    }
  } else {
    throw std::invalid_argument(dir + " holds neither " + kSingleFile + " nor " + kIndexFile +
                                ": pass a Hugging Face model folder with its weights in "
                                "safetensors (convert .bin weights with transformers first)");
  }

  std::set<std::string> known;
  for (const auto& tensor : tensors) known.insert(tensor.theirs);
  for (const auto& [name, file] : file_of) {
    // transformers passes over these too: a tied folder's own head, and the RoPE frequencies older
    // files saved as buffers.
    const bool passed_over = (config.tie_word_embeddings && name == "lm_head.weight") ||
                             ends_with(name, ".rotary_emb.inv_freq");
    if (known.count(name) == 0 && !passed_over) {
      throw std::invalid_argument(
          listing + " holds tensor \"" + name + "\", which the model of its config.json (" +
          shape_words(config) +
          ") has no place for: the weights are of another model or variant than config.json "
          "describes; use the config.json written with them");
    }
  }
  for (const auto& tensor : tensors) {
    if (file_of.count(tensor.theirs) == 0) {
      throw std::invalid_argument(
          listing + " has no tensor \"" + tensor.theirs + "\" (shape " + shape_text(tensor.shape) +
          "), which the model of its config.json (" + shape_words(config) +
          ") needs: the folder is incomplete, or its config.json is not the one written with "
          "the weights" +
          (tensor.theirs == "lm_head.weight" ? " (tie_word_embeddings is false)" : ""));
    }
  }
  return {file_of, listing};
}

// Refuses a tensor `file` holds as `dtype` of `sizes` where the decoder of shape `config` has
// `tensor`.
void check_stored_tensor(const std::string& file, const DecoderTensor& tensor, at::ScalarType dtype,
                         at::IntArrayRef sizes, const nn::DecoderConfig& config) {
  if (!at::isFloatingType(dtype)) {
    throw std::invalid_argument(file + ": tensor \"" + tensor.theirs + "\" is " +
                                c10::toString(dtype) +
                                ", not floating point (fp32, bf16 or fp16): quantized weights are "
                                "not read; use the unquantized model");
  }
  if (sizes != at::IntArrayRef(tensor.shape)) {
    throw std::invalid_argument(file + ": tensor \"" + tensor.theirs + "\" has shape " +
                                shape_text(sizes) + ", not the " + shape_text(tensor.shape) +
                                " the model of config.json (" + shape_words(config) +
                                ") has there: use the config.json written with these weights");
  }
}

// Refuses a `file`, which `listing` names for tensors of the folder, that is not there.
void expect_shard(const std::string& file, const std::string& listing) {
  if (!fs::is_regular_file(file)) {
    throw std::invalid_argument(listing + " puts tensors in " + file +
                                ", which does not exist: the folder is incomplete (download or "
                                "copy that shard)");
  }
}

[[noreturn]] void not_in_shard(const std::string& listing, const DecoderTensor& tensor,
                               const std::string& file) {
  throw std::invalid_argument(listing + " puts tensor \"" + tensor.theirs + "\" in " + file +
                              ", which does not hold it: the index is not the one written with "
                              "the shards");
}

}  // namespace

void check_hf_decoder_weights(const std::string& dir, const nn::DecoderConfig& config) {
  const auto tensors = decoder_tensors(config);
  const FolderListing folder = list_decoder_folder(dir, config, tensors);
  std::map<std::string, std::map<std::string, SafetensorsEntry>> headers;  // by file
  for (const auto& tensor : tensors) {
    const std::string& file = folder.file_of.at(tensor.theirs);
    if (headers.count(file) == 0) {
      expect_shard(file, folder.listing);
      headers[file] = read_weights_header(file);
    }
    const auto entry = headers[file].find(tensor.theirs);
    if (entry == headers[file].end()) not_in_shard(folder.listing, tensor, file);
    check_stored_tensor(file, tensor, entry->second.dtype, entry->second.shape, config);
  }
}

std::map<std::string, at::Tensor> read_hf_decoder_weights(
    const std::string& dir, const nn::DecoderConfig& config,
    const std::function<bool(const std::string& pipetrain_name)>& wanted) {
  const auto tensors = decoder_tensors(config);
  const FolderListing folder = list_decoder_folder(dir, config, tensors);
  const auto& file_of = folder.file_of;
  const std::string& listing = folder.listing;
  const std::string tied_head = std::to_string(config.n_layer + 2) + ".weight";
  const auto is_wanted = [&](const DecoderTensor& tensor) {
    if (!wanted) return true;
    return wanted(tensor.ours) ||
           (config.tie_word_embeddings && tensor.ours == "0.weight" && wanted(tied_head));
  };
  // Each file opened once, only when it holds a tensor wanted, and only those tensors read.
  std::map<std::string, std::vector<const DecoderTensor*>> wanted_by_file;
  for (const auto& tensor : tensors) {
    if (is_wanted(tensor)) wanted_by_file[file_of.at(tensor.theirs)].push_back(&tensor);
  }
  std::map<std::string, at::Tensor> weights;
  for (const auto& [file, wanted_here] : wanted_by_file) {
    expect_shard(file, listing);
    std::set<std::string> held;
    for (const auto& [name, entry] : read_weights_header(file)) held.insert(name);
    std::set<std::string> names;
    for (const DecoderTensor* tensor : wanted_here) {
      if (held.count(tensor->theirs)) names.insert(tensor->theirs);
    }
    const TensorMap stored = load_safetensors(file, names);
    for (const DecoderTensor* tensor : wanted_here) {
      const auto found = stored.find(tensor->theirs);
      if (found == stored.end()) not_in_shard(listing, *tensor, file);
      const at::Tensor& value = found->second;
      check_stored_tensor(file, *tensor, value.scalar_type(), value.sizes(), config);
      weights[tensor->ours] = value.to(at::kFloat).contiguous();
    }
  }
  return weights;
}

std::vector<LayerSpec> hf_decoder_layers(const nn::DecoderConfig& config,
                                         const std::string& init_from) {
  if (init_from.empty()) return nn::decoder_layers(config);
  return layers_read_from(nn::decoder_layers(config), init_from,
                          [config, init_from](const auto& wanted) {
                            return read_hf_decoder_weights(init_from, config, wanted);
                          });
}

WeightSource WeightSource::of(const std::map<std::string, at::Tensor>& weights) {
  WeightSource source;
  for (const auto& [name, tensor] : weights) source.shapes[name] = tensor.sizes().vec();
  source.read = [&weights](const std::set<std::string>& names) {
    std::map<std::string, at::Tensor> some;
    for (const auto& name : names) some[name] = weights.at(name);
    return some;
  };
  return source;
}

WeightSource WeightSource::of(const StoredWeights& stored) {
  return WeightSource{stored.shapes(),
                      [&stored](const std::set<std::string>& names) { return stored.read(names); }};
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
  const auto tensors = decoder_tensors(config);
  const std::string tied_head = std::to_string(config.n_layer + 2) + ".weight";
  std::set<std::string> expected;
  for (const auto& tensor : tensors) expected.insert(tensor.ours);
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
  std::vector<int64_t> bytes;
  for (const auto& tensor : tensors) {
    const auto found = weights.shapes.find(tensor.ours);
    if (found == weights.shapes.end()) {
      throw std::invalid_argument("the weights have no \"" + tensor.ours + "\", which a " +
                                  model_type + " of " + shape_words(config) + " needs");
    }
    if (found->second != tensor.shape) {
      throw std::invalid_argument("\"" + tensor.ours + "\" has shape " + shape_text(found->second) +
                                  ", not the " + shape_text(tensor.shape) + " of a " + model_type +
                                  " of " + shape_words(config));
    }
    int64_t elements = 1;
    for (const int64_t size : found->second) elements *= size;
    bytes.push_back(elements * static_cast<int64_t>(c10::elementSize(dtype)));
  }
  const TokenizerSource tokenizer = read_tokenizer_source(tokenizer_from, config.vocab_size);

  const fs::path folder(dir);
  std::error_code error;
  fs::create_directories(folder, error);
  if (error) throw std::runtime_error("cannot create " + dir + ": " + error.message());

  // One shard read and converted at a time: never a second whole copy of the model, and from a
  // checkpoint's files never more than one output shard's tensors.
  const auto shards = plan_shards(bytes, max_shard_bytes);
  std::set<std::string> written;
  Json weight_map = Json::object();
  int64_t total_size = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name = shards.size() == 1 ? kSingleFile : shard_name(s, shards.size());
    std::set<std::string> ours;
    for (const size_t i : shards[s]) ours.insert(tensors[i].ours);
    const auto read = weights.read(ours);
    TensorMap shard;
    for (const size_t i : shards[s]) {
      shard[tensors[i].theirs] =
          read.at(tensors[i].ours).detach().to(at::kCPU).to(dtype).contiguous();
      weight_map[tensors[i].theirs] = name;
      total_size += bytes[i];
    }
    // transformers' from_pretrained asks for the "pt" format in the metadata.
    save_safetensors((folder / name).string(), shard, {{"format", "pt"}});
    written.insert(name);
  }
  if (shards.size() > 1) {
    const Json index{{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
    write_file((folder / kIndexFile).string(), index.dump(2) + "\n");
    written.insert(kIndexFile);
  }
  write_file((folder / "config.json").string(),
             config_json(config, model_type, dtype, tokenizer.token_ids).dump(2) + "\n");
  bool source_generation_config = false;
  for (const auto& file : tokenizer.files) {
    source_generation_config |= file.filename() == "generation_config.json";
    const fs::path target = folder / file.filename();
    if (fs::exists(target) && fs::equivalent(file, target)) continue;  // exported into the source
    write_file(target.string(), read_text(file));
  }
  if (!source_generation_config) {
    Json generation{{"_from_model_config", true}};
    generation.update(tokenizer.token_ids);
    write_file((folder / "generation_config.json").string(), generation.dump(2) + "\n");
  }
  remove_stale_weight_files(folder, written);
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

}  // namespace pipetrain::cli
