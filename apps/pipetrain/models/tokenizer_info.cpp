#include "models/tokenizer_info.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>

#include "io/file_writer.h"

namespace pipetrain::cli {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

Json optional_id(const std::optional<int64_t>& id) { return id ? Json(*id) : Json(nullptr); }

Json counts(const SplitCounts& split) {
  return {{"documents", split.documents}, {"tokens", split.tokens}, {"shards", split.shards}};
}

}  // namespace

void write_tokenizer_info(const std::string& folder, const TokenizerInfo& info) {
  const Json json = {{"tokenizer", info.tokenizer},
                     {"vocab_size", info.vocab_size},
                     {"bos_token_id", optional_id(info.bos_token_id)},
                     {"eos_token_id", optional_id(info.eos_token_id)},
                     {"dtype", info.dtype},
                     {"shard_size", info.shard_size},
                     {"train", counts(info.train)},
                     {"val", counts(info.val)}};
  write_file((fs::path(folder) / kTokenizerInfoFile).string(), json.dump(2) + "\n");
}

void check_tokenizer_vocabulary(const std::vector<std::string>& files, int64_t vocab_size,
                                const std::string& flag, const std::string& source) {
  std::set<fs::path> folders;
  for (const auto& file : files) folders.insert(fs::path(file).parent_path());
  for (const auto& folder : folders) {
    const fs::path path = folder / kTokenizerInfoFile;
    if (!fs::exists(path)) continue;
    Json info;
    try {
      info = Json::parse(std::ifstream(path));
    } catch (const Json::exception& e) {
      throw std::invalid_argument(flag + " " + source + ": " + path.string() +
                                  " is not JSON: " + e.what());
    }
    const auto size = info.find("vocab_size");
    if (size == info.end() || !size->is_number_integer()) {
      throw std::invalid_argument(flag + " " + source + ": " + path.string() +
                                  " has no integer vocab_size");
    }
    if (size->get<int64_t>() > vocab_size) {
      throw std::invalid_argument(
          flag + " " + source + ": its tokens come from a vocabulary of " +
          std::to_string(size->get<int64_t>()) + " ids (" + path.string() + ", tokenizer " +
          info.value("tokenizer", std::string("unknown")) + "), more than the model's " +
          std::to_string(vocab_size) +
          " (--vocab-size, or --init-from's config.json): train a model of that vocabulary, or "
          "prepare the data with the model's own tokenizer");
    }
  }
}

}  // namespace pipetrain::cli
