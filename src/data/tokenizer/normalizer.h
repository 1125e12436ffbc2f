// tokenizer.json's "normalizer": what the text becomes before it is split (Unicode normal forms,
// lowercase, replacements, a prepended string), as Hugging Face's tokenizers normalize it.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace pipetrain::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

// The normalizer `config` describes (NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, Strip,
// StripAccents, Sequence), or null for a null config. Throws std::invalid_argument naming a type
// or option that is not implemented.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& config);

}  // namespace pipetrain::tokenizer
