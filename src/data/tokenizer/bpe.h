// tokenizer.json's "model" of type BPE: a vocabulary and a ranked list of merges, applied to each
// pre-tokenized piece as Hugging Face's tokenizers apply them (the lowest-ranked adjacent pair
// merged first, the leftmost among equals), with its options: ignore_merges (a piece that is a
// token is that token), byte_fallback (<0x..> tokens for characters the vocabulary lacks),
// unk_token and fuse_unk, continuing_subword_prefix and end_of_word_suffix.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace pipetrain::tokenizer {

class Bpe {
 public:
  // Throws std::invalid_argument for a merge naming a token outside the vocabulary, BPE dropout
  // (random tokenizations), or a malformed vocabulary or merge.
  explicit Bpe(const nlohmann::json& model);

  // Appends the ids of `piece` to `ids`.
  void tokenize(std::string_view piece, std::vector<int64_t>& ids) const;

  std::optional<int64_t> token_to_id(std::string_view token) const;
  // The token of `id`, or null for an id the vocabulary lacks.
  const std::string* id_to_token(int64_t id) const;
  // One more than the largest id.
  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  // The number of tokens (fewer than vocab_size() where ids are skipped).
  int64_t entry_count() const { return static_cast<int64_t>(ids_.size()); }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  // The ids of `piece` before the cache: characters first, then merges.
  std::vector<int32_t> merge_piece(std::string_view piece) const;
  const Merge* merge_of(int32_t left, int32_t right) const;

  std::vector<std::string> tokens_;                    // by id ("" where an id has no token)
  std::unordered_map<std::string_view, int32_t> ids_;  // views of tokens_
  std::unordered_map<uint64_t, Merge> merges_;         // by (left id << 32 | right id)
  std::optional<std::string> unk_token_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  // Tells this model's entries in a thread's cache from another model's.
  uint64_t cache_owner_;
};

}  // namespace pipetrain::tokenizer
