// The JSON files of a Hugging Face model folder (config.json, the weights' index, the tokenizer's
// files), read so that every error names the file and the key. Internal: nlohmann's types stay out
// of the public headers, so that the installed package does not ask its users for nlohmann_json.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain {

// The keys of one JSON object of a file, read so that every error names the file and the key.
class JsonFields {
 public:
  JsonFields(std::string file, const nlohmann::json& object, std::string prefix = "")
      : file_(std::move(file)), object_(object), prefix_(std::move(prefix)) {}

  // Present and not null.
  bool has(const std::string& key) const;
  const nlohmann::json& at(const std::string& key) const;
  int64_t integer(const std::string& key) const;
  int64_t integer(const std::string& key, int64_t fallback) const;
  double number(const std::string& key) const;
  double number(const std::string& key, double fallback) const;
  bool boolean(const std::string& key, bool fallback) const;
  std::string string(const std::string& key) const;
  std::string string(const std::string& key, const std::string& fallback) const;
  // Throws std::invalid_argument: "<file>: "<prefix><key>" <what>".
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;

 private:
  std::string file_;
  const nlohmann::json& object_;
  std::string prefix_;
};

// The bytes of `path`; std::runtime_error naming it when it cannot be read.
std::string read_text(const std::string& path);

// Parses `path` as a JSON object; std::invalid_argument naming it when it is not one.
nlohmann::json read_json_object(const std::string& path);

// Whether a file of this name is one of the tokenizer's (or its generation defaults), which an
// export copies from the folder the model was trained from.
bool is_tokenizer_file(const std::string& name);

// What `tokenizer_from` contributes to an export, read before anything is written.
struct TokenizerSource {
  std::vector<std::string> files;                       // paths of its tokenizer files
  nlohmann::json token_ids = nlohmann::json::object();  // bos_token_id, eos_token_id of config.json
};

// The tokenizer of `tokenizer_from` ("": none), for a model of `vocab_size` tokens. Throws
// std::invalid_argument when the folder is missing or its config.json has another vocabulary.
TokenizerSource read_tokenizer_source(const std::string& tokenizer_from, int64_t vocab_size);

// Copies the tokenizer files of `source` into `dir` (atomically each; a file exported into its own
// source folder is left as it is); writes a minimal generation_config.json where the source has
// none.
void write_tokenizer_files(const TokenizerSource& source, const std::string& dir);

}  // namespace pipetrain
