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
  return {{"documents", split.documents},
          {"tokens", split.tokens},
          {"shards", split.shards},
          {"documents_not_delimited_by_eos", split.documents_not_delimited_by_eos}};
}

// The folders holding `files`.
std::set<fs::path> folders_of(const std::vector<std::string>& files) {
  std::set<fs::path> folders;
  for (const auto& file : files) folders.insert(fs::path(file).parent_path());
  return folders;
}

// `path` (a tokenizer_info.json) parsed; std::invalid_argument naming `where` if it is not JSON.
Json read_info(const fs::path& path, const std::string& where) {
  try {
    return Json::parse(std::ifstream(path));
  } catch (const Json::exception& e) {
    throw std::invalid_argument(where + ": " + path.string() + " is not JSON: " + e.what());
  }
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
  for (const auto& folder : folders_of(files)) {
    const fs::path path = folder / kTokenizerInfoFile;
    if (!fs::exists(path)) continue;
    const Json info = read_info(path, flag + " " + source);
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

std::string recorded_tokenizer(const std::string& folder) {
  const fs::path path = fs::path(folder) / kTokenizerInfoFile;
  if (!fs::exists(path)) return "";
  const Json info = read_info(path, folder);
  return info.is_object() ? info.value("tokenizer", std::string()) : "";
}

int64_t document_separator(const std::vector<std::string>& files, const std::string& split,
                           const std::string& flag, const std::string& source) {
  const std::string where = "--document-masking: " + flag + " " + source;
  std::optional<int64_t> separator;
  for (const auto& folder : folders_of(files)) {
    const fs::path path = folder / kTokenizerInfoFile;
    if (!fs::exists(path)) {
      throw std::invalid_argument(
          where + " has no " + kTokenizerInfoFile + " beside its files (" + path.string() +
          "), which says the token that ends each document: make the files with pipetrain "
          "prepare-data --tokenizer, or train without --document-masking");
    }
    const Json info = read_info(path, where);
    const auto eos = info.find("eos_token_id");
    if (eos == info.end() || !eos->is_number_integer()) {
      throw std::invalid_argument(where + ": " + path.string() +
                                  " gives no eos_token_id to end documents with");
    }
    if (separator && *separator != eos->get<int64_t>()) {
      throw std::invalid_argument(where + ": its folders end documents with different tokens (" +
                                  std::to_string(*separator) + " and " +
                                  std::to_string(eos->get<int64_t>()) + ", " + path.string() + ")");
    }
    separator = eos->get<int64_t>();
    const auto split_counts = info.value(split, Json::object());
    const auto undelimited = split_counts.find("documents_not_delimited_by_eos");
    if (undelimited == split_counts.end() || !undelimited->is_number_integer()) {
      throw std::invalid_argument(where + ": " + path.string() + " does not count the " + split +
                                  " documents that its EOS does not delimit (an older "
                                  "prepare-data wrote it): prepare the data again");
    }
    if (undelimited->get<int64_t>() > 0) {
      throw std::invalid_argument(
          where + ": the EOS " + std::to_string(*separator) + " does not end " +
          std::to_string(undelimited->get<int64_t>()) + " of its " + split + " documents alone (" +
          path.string() +
          "; a chat template ends turns with it, or ends conversations otherwise), so it cannot "
          "mark where one document ends: train without --document-masking");
    }
  }
  if (!separator) throw std::invalid_argument(where + " names no token files");
  return *separator;
}

}  // namespace pipetrain::cli
