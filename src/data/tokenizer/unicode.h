// The Unicode character classes the tokenizer's components test one code point against, as
// Rust's char methods define them (Hugging Face's tokenizers are written with them).
#pragma once

namespace pipetrain::tokenizer {

// Rust's regex crate's \w, as a PCRE2 character class: Hugging Face's Whitespace pre-tokenizer
// and its added tokens' word boundaries are written with it, and PCRE2's own \w (letters,
// numbers, underscore) leaves out marks and joiners.
constexpr const char* kWordClass = R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])";

// char::is_whitespace: the White_Space property.
bool is_whitespace(char32_t code_point);
// A nonspacing mark (category Mn), what StripAccents removes.
bool is_nonspacing_mark(char32_t code_point);

}  // namespace pipetrain::tokenizer
