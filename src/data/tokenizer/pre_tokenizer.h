// tokenizer.json's "pre_tokenizer": how normalized text is cut into the pieces the model
// tokenizes one by one (GPT-2's and Llama 3's regular expressions, byte-level symbols, digits,
// SentencePiece's metaspace), as Hugging Face's tokenizers cut it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace pipetrain::tokenizer {

struct Piece {
  std::string text;
  // Whether the piece begins where the encoded text begins (Metaspace's prepend_scheme "first"
  // adds its symbol there alone).
  bool at_start = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces each piece by the pieces it is cut into; empty pieces are dropped.
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

// The pre-tokenizer `config` describes (Sequence, Split, ByteLevel, Digits, Metaspace,
// Whitespace, WhitespaceSplit, Punctuation), or null for a null config. Throws
// std::invalid_argument naming a type or option that is not implemented.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& config);

}  // namespace pipetrain::tokenizer
