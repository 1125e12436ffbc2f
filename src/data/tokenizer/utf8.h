// UTF-8 as the tokenizer reads it: one code point at a time, and text checked to be UTF-8 before
// it is tokenized (Hugging Face's tokenizers take Rust strings, which are valid UTF-8 by type).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace pipetrain::tokenizer {

// The byte offset of the first byte of `text` that is not part of well-formed UTF-8 (overlong
// forms, surrogates and code points above U+10FFFF included), or nothing for valid text.
std::optional<size_t> first_invalid_utf8(std::string_view text);

// `bytes` with each maximal ill-formed subsequence replaced by U+FFFD, as Rust's
// String::from_utf8_lossy (and the Unicode standard's recommended practice) replace them.
std::string to_valid_utf8(std::string_view bytes);

// The code point at `text[at]` of valid UTF-8, and moves `at` past it.
char32_t next_code_point(std::string_view text, size_t& at);

// Appends `code_point` to `out` in UTF-8.
void append_utf8(std::string& out, char32_t code_point);

}  // namespace pipetrain::tokenizer
