// The tokenizer's regular expressions: PCRE2 in UTF and Unicode-property mode (`\p{L}`, `\s` and
// `\w` over all of Unicode, as the Oniguruma and Rust expressions of Hugging Face's tokenizers),
// compiled once and matched by PCRE2's JIT. std::regex knows no Unicode properties.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace pipetrain::tokenizer {

class Regex {
 public:
  // Compiles `pattern`, or matches it as plain text where `literal`. Throws
  // std::invalid_argument naming the pattern and PCRE2's reason and offset.
  explicit Regex(const std::string& pattern, bool literal = false);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // Every non-overlapping match of `text`, left to right, as [begin, end) byte offsets; after
  // an empty match the search resumes one code point further on.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;
  // `text` with every match replaced by `replacement`, taken as is.
  std::string replace_all(std::string_view text, const std::string& replacement) const;
  // Whether the pattern matches somewhere in `text`.
  bool search(std::string_view text) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Compiled;
  std::string pattern_;
  std::unique_ptr<Compiled> compiled_;
};

// The pattern of a tokenizer.json component: {"String": text} (matched as is) or
// {"Regex": expression}. Throws std::invalid_argument for anything else.
Regex pattern_of(const nlohmann::json& pattern);

}  // namespace pipetrain::tokenizer
