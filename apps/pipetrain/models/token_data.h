// The language models' data: --train-data and --val-data, each a token file, a folder of shards
// or a glob of them (pipetrain/token_shards.h), read as one dataset of the model's vocabulary.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <pipetrain/token_shards.h>

namespace pipetrain::cli {

struct TokenData {
  std::shared_ptr<const Dataset> train;
  std::shared_ptr<const Dataset> val;  // null: no validation data
  // Whether targets may be kMaskedTarget: loss masks beside the files, or document masking.
  bool masked = false;
  // With document masking, the token that ends each document (pipetrain/packed_documents.h).
  std::optional<int64_t> document_separator;
};

// Opens `train_data` (its train shards where it is a folder) and `val_data` (its val shards); an
// empty `val_data` means the validation data beside the training data where there is some: a
// folder's val shards (or val.bin), a pattern's with _val_ for _train_, a file's val.bin beside
// it. Throws std::invalid_argument for what TokenShards refuses, 16-bit tokens for a vocabulary
// past 65536, and a folder whose tokenizer_info.json gives a larger vocabulary than `vocab_size`.
// With `document_masking`, the documents' separator comes from the folders' tokenizer_info.json
// (document_separator() there, with its errors), and targets that start a document are masked.
TokenData read_token_data(const std::string& train_data, const std::string& val_data,
                          int64_t block_size, int64_t vocab_size, bool document_masking = false);

}  // namespace pipetrain::cli
