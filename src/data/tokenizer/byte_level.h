// GPT-2's byte-level alphabet, shared by Hugging Face's ByteLevel pre-tokenizer and decoder: each
// of the 256 byte values is shown as one printable code point (printable ASCII and Latin-1 as
// themselves, the rest shifted to U+0100 and up), so that BPE works on text of any bytes and
// every byte sequence has a spelling in the vocabulary.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace pipetrain::tokenizer {

// The UTF-8 of the code point that stands for `byte`.
const std::string& byte_to_symbol(unsigned char byte);
// `text`'s bytes, each as its symbol.
std::string bytes_to_symbols(std::string_view text);
// The byte a code point stands for, or nothing for one outside the alphabet.
std::optional<unsigned char> symbol_to_byte(char32_t code_point);

}  // namespace pipetrain::tokenizer
