// tokenizer_info.json: what `pipetrain prepare-data --tokenizer` writes beside its shards, so that
// the folder says which tokenizer made its tokens (and a model of a smaller vocabulary is refused
// before it trains on ids it has no embedding for). Its keys: "tokenizer" (the tokenizer.json
// read), "vocab_size", "bos_token_id" and "eos_token_id" (null where the tokenizer has none),
// "dtype" ("uint16" or "uint32"), "shard_size", and per split ("train", "val") the documents,
// tokens and shard file names, and "documents_not_delimited_by_eos": those whose last token is not
// the EOS, or which hold it before their end too (a chat template's end of turn), whose ends
// document masking cannot find.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pipetrain::cli {

inline constexpr const char* kTokenizerInfoFile = "tokenizer_info.json";

struct SplitCounts {
  int64_t documents = 0;
  int64_t tokens = 0;
  std::vector<std::string> shards;  // file names, in order
  int64_t documents_not_delimited_by_eos = 0;
};

struct TokenizerInfo {
  std::string tokenizer;
  int64_t vocab_size = 0;
  std::optional<int64_t> bos_token_id, eos_token_id;
  std::string dtype;
  int64_t shard_size = 0;
  SplitCounts train, val;
};

// Writes `folder`/tokenizer_info.json, replacing it atomically.
void write_tokenizer_info(const std::string& folder, const TokenizerInfo& info);

// Refuses token files whose folder's tokenizer_info.json gives a vocabulary larger than the
// model's `vocab_size`: std::invalid_argument naming `flag` (--train-data, --val-data), `source`
// and both sizes. Files in a folder without one pass.
void check_tokenizer_vocabulary(const std::vector<std::string>& files, int64_t vocab_size,
                                const std::string& flag, const std::string& source);

// The tokenizer file that `folder`'s tokenizer_info.json names; "" where the folder has none.
// Throws std::invalid_argument naming the file where it is not JSON.
std::string recorded_tokenizer(const std::string& folder);

// The token that ends every document of the `split` ("train", "val") files `files`, for document
// masking: their folder's tokenizer_info.json's eos_token_id. Throws std::invalid_argument naming
// `flag` and `source` where a folder has none (the files say nothing of their documents), its
// tokenizer has no EOS, the folders disagree, or the EOS stands inside documents too.
int64_t document_separator(const std::vector<std::string>& files, const std::string& split,
                           const std::string& flag, const std::string& source);

}  // namespace pipetrain::cli
