// tokenizer.json's "added_tokens": tokens outside the model's merges (special tokens such as
// <|endoftext|>, and any a user added), found in the text before anything else runs and never
// split, as Hugging Face's tokenizers find them: leftmost, then longest; a token with
// `normalized` false is matched in the raw text, one with true in the normalized text;
// `single_word`, `lstrip` and `rstrip` as there.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "data/tokenizer/regex.h"

namespace pipetrain::tokenizer {

class Bpe;
class Normalizer;

// A stretch of the text: an added token (its id set) or text still to be tokenized.
struct Segment {
  std::string text;
  std::optional<int32_t> id;
  bool at_start = false;  // begins where the encoded text begins
};

class AddedVocabulary {
 public:
  // `normalizer` (may be null) gives the form a normalized token is matched in.
  AddedVocabulary(const nlohmann::json& added_tokens, const Bpe& model,
                  const Normalizer* normalizer);

  // Cuts every segment without an id around the added tokens whose `normalized` flag is
  // `normalized`.
  void split(std::vector<Segment>& segments, bool normalized) const;

  std::optional<int32_t> token_to_id(std::string_view content) const;
  const std::string* id_to_token(int64_t id) const;
  bool is_special(int64_t id) const;
  // One more than the largest added id (0 without added tokens).
  int64_t id_end() const { return id_end_; }

 private:
  struct Token {
    int32_t id;
    std::string content;
    bool single_word, lstrip, rstrip, normalized, special;
    std::string text;  // what is matched: the content, normalized where `normalized`
  };
  // A byte trie of one kind's patterns.
  struct Trie {
    struct Node {
      std::unordered_map<unsigned char, int> children;
      int token = -1;  // index into tokens_ where a pattern ends here
    };
    std::vector<Node> nodes{1};
    void insert(const std::string& pattern, int token);
    // The token of the longest pattern that begins at `text[at]` and its length, if any.
    std::optional<std::pair<int, size_t>> longest_at(std::string_view text, size_t at) const;
  };
  // [begin, end) and the token of each match in `text`, lstrip/rstrip applied.
  std::vector<std::pair<std::pair<size_t, size_t>, int>> find(std::string_view text,
                                                              const Trie& trie) const;
  bool is_word_at_end(std::string_view text) const;
  bool is_word_at_start(std::string_view text) const;

  std::vector<Token> tokens_;
  std::unordered_map<int64_t, size_t> by_id_;
  std::unordered_map<std::string, int32_t> by_content_;
  Trie raw_, normalized_;
  Regex word_character_;
  int64_t id_end_ = 0;
};

}  // namespace pipetrain::tokenizer
