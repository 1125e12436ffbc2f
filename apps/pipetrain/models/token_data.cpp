#include "models/token_data.h"

#include <filesystem>
#include <stdexcept>

#include <pipetrain/packed_documents.h>

#include "models/tokenizer_info.h"

namespace pipetrain::cli {
namespace {

namespace fs = std::filesystem;

// `files` (`source`'s, for `flag`) as one dataset of a model's vocabulary. 16-bit tokens cannot
// hold a vocabulary past 65536: such a file (nanoGPT's raw layout) is most likely 32-bit tokens
// read two halves at a time, which would train on ids that all lie in range, so it is refused.
std::shared_ptr<const TokenShards> open_files(const std::string& flag, const std::string& source,
                                              const std::vector<std::string>& files,
                                              int64_t block_size, int64_t vocab_size) {
  check_tokenizer_vocabulary(files, vocab_size, flag, source);
  auto data = std::make_shared<const TokenShards>(files, block_size, vocab_size);
  constexpr int64_t kUint16Tokens = int64_t{1} << 16;
  if (vocab_size > kUint16Tokens && data->dtype() == TokenDtype::kUint16) {
    throw std::invalid_argument(
        flag + " " + source +
        " holds 16-bit tokens (a raw file, or an llm.c GPT-2 shard), which cannot hold a "
        "vocabulary of " +
        std::to_string(vocab_size) +
        ": write llm.c's Llama 3 shards of 32-bit tokens (pipetrain prepare-data --tokenizer, or "
        "--file-format llmc --token-dtype uint32, or llm.c's own)");
  }
  return data;
}

// Whether `source` names any token files of `split`.
bool has_files(const std::string& source, const std::string& split) {
  try {
    return !find_token_files(source, split).empty();
  } catch (const std::invalid_argument&) {
    return false;
  }
}

// The validation data beside `train_data`, or "" where there is none.
std::string default_val_data(const std::string& train_data) {
  if (fs::is_directory(train_data)) return has_files(train_data, "val") ? train_data : "";
  const size_t train = train_data.rfind("_train_");
  if (!fs::exists(train_data) && train != std::string::npos) {
    const std::string val = std::string(train_data).replace(train, 7, "_val_");
    return has_files(val, "val") ? val : "";
  }
  const auto beside = (fs::path(train_data).parent_path() / "val.bin").string();
  return fs::exists(beside) ? beside : "";
}

}  // namespace

TokenData read_token_data(const std::string& train_data, const std::string& val_data,
                          int64_t block_size, int64_t vocab_size, bool document_masking) {
  const std::string val = val_data.empty() ? default_val_data(train_data) : val_data;
  const auto train_paths = find_token_files(train_data, "train");
  const auto val_paths = val.empty() ? std::vector<std::string>() : find_token_files(val, "val");
  const auto train_files =
      open_files("--train-data", train_data, train_paths, block_size, vocab_size);
  const auto val_files =
      val.empty() ? nullptr : open_files("--val-data", val, val_paths, block_size, vocab_size);
  TokenData data;
  data.train = train_files;
  data.val = val_files;
  data.masked = train_files->masked() || (val_files && val_files->masked());
  if (!document_masking) return data;
  data.document_separator = document_separator(train_paths, "train", "--train-data", train_data);
  data.train = mask_document_starts(data.train, *data.document_separator);
  if (val_files) {
    const int64_t val_separator = document_separator(val_paths, "val", "--val-data", val);
    if (val_separator != *data.document_separator) {
      throw std::invalid_argument(
          "--document-masking: --val-data " + val + " ends its documents with token " +
          std::to_string(val_separator) + ", --train-data " + train_data + " with " +
          std::to_string(*data.document_separator) + ": prepare both with one tokenizer");
    }
    data.val = mask_document_starts(data.val, val_separator);
  }
  data.masked = true;
  return data;
}

}  // namespace pipetrain::cli
