// The Unicode character classes the tokenizer's components test one code point against, as
// Rust's char methods define them (Hugging Face's tokenizers are written with them).
#pragma once

#include <string>
#include <string_view>

namespace pipetrain::tokenizer {

// Rust's regex crate's \w, as a PCRE2 character class: Hugging Face's Whitespace pre-tokenizer
// and its added tokens' word boundaries are written with it, and PCRE2's own \w (letters,
// numbers, underscore) leaves out marks and joiners.
constexpr const char* kWordClass = R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])";

// char::is_whitespace: the White_Space property.
bool is_whitespace(char32_t code_point);
// A nonspacing mark (category Mn), what StripAccents removes.
bool is_nonspacing_mark(char32_t code_point);
// The simple lowercase mapping of one code point.
char32_t simple_lowercase(char32_t code_point);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
// `text` (valid UTF-8) in Unicode normal form `form`.
std::string normalized(std::string_view text, NormalForm form);

// Whether this build has the libraries the tokenizer's components need: PCRE2 (regular
// expressions) and utf8proc (the functions above but is_whitespace). Where one is missing (a
// machine without libpcre2-dev or libutf8proc-dev when pipetrain was built), the components that
// need it throw std::invalid_argument saying so when a tokenizer.json asks for them.
bool built_with_unicode_libraries();
// Throws that error for `component` (a normalizer's name) where utf8proc is missing.
void require_unicode_data(const std::string& component);

}  // namespace pipetrain::tokenizer
