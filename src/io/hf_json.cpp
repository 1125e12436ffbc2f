#include "io/hf_json.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "io/file_writer.h"

namespace pipetrain {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

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

}  // namespace

bool JsonFields::has(const std::string& key) const {
  return object_.contains(key) && !object_.at(key).is_null();
}

const Json& JsonFields::at(const std::string& key) const {
  if (!has(key)) fail(key, "is missing: the file is incomplete, or not a Hugging Face model's");
  return object_.at(key);
}

int64_t JsonFields::integer(const std::string& key) const {
  const Json& value = at(key);
  // Some configs write whole numbers as floats (8192.0).
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float() && std::floor(value.get<double>()) == value.get<double>()) {
    return static_cast<int64_t>(value.get<double>());
  }
  fail(key, "is " + value.dump() + ", not a whole number");
}

int64_t JsonFields::integer(const std::string& key, int64_t fallback) const {
  return has(key) ? integer(key) : fallback;
}

double JsonFields::number(const std::string& key) const {
  const Json& value = at(key);
  if (!value.is_number()) fail(key, "is " + value.dump() + ", not a number");
  return value.get<double>();
}

double JsonFields::number(const std::string& key, double fallback) const {
  return has(key) ? number(key) : fallback;
}

bool JsonFields::boolean(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const Json& value = at(key);
  if (!value.is_boolean()) fail(key, "is " + value.dump() + ", not true or false");
  return value.get<bool>();
}

std::string JsonFields::string(const std::string& key) const {
  const Json& value = at(key);
  if (!value.is_string()) fail(key, "is " + value.dump() + ", not a string");
  return value.get<std::string>();
}

std::string JsonFields::string(const std::string& key, const std::string& fallback) const {
  return has(key) ? string(key) : fallback;
}

void JsonFields::fail(const std::string& key, const std::string& what) const {
  throw std::invalid_argument(file_ + ": \"" + prefix_ + key + "\" " + what);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) throw std::runtime_error("cannot read " + path);
  return bytes.str();
}

Json read_json_object(const std::string& path) {
  Json json;
  try {
    json = Json::parse(read_text(path));
  } catch (const Json::exception& e) {
    throw std::invalid_argument(path + " is not valid JSON (" + e.what() +
                                "): write it again, or download it again");
  }
  if (!json.is_object()) {
    throw std::invalid_argument(path + " holds a JSON " + json.type_name() + ", not an object");
  }
  return json;
}

bool is_tokenizer_file(const std::string& name) {
  return std::find(std::begin(kTokenizerFiles), std::end(kTokenizerFiles), name) !=
         std::end(kTokenizerFiles);
}

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
    if (fs::is_regular_file(folder / name)) source.files.push_back((folder / name).string());
  }
  // A folder of weights alone (save_pretrained of a model made from a config) has none to copy.
  if (fs::is_regular_file(folder / "config.json")) {
    const Json config = read_json_object((folder / "config.json").string());
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

void write_tokenizer_files(const TokenizerSource& source, const std::string& dir) {
  const fs::path folder(dir);
  bool source_generation_config = false;
  for (const auto& path : source.files) {
    const fs::path file(path);
    source_generation_config |= file.filename() == "generation_config.json";
    const fs::path target = folder / file.filename();
    if (fs::exists(target) && fs::equivalent(file, target)) continue;  // exported into the source
    write_file(target.string(), read_text(path));
  }
  if (!source_generation_config) {
    Json generation{{"_from_model_config", true}};
    generation.update(source.token_ids);
    write_file((folder / "generation_config.json").string(), generation.dump(2) + "\n");
  }
}

}  // namespace pipetrain
