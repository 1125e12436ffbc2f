#include "data/tokenizer/byte_level.h"

#include <array>

#include "data/tokenizer/utf8.h"

namespace pipetrain::tokenizer {

namespace {

// GPT-2's bytes_to_unicode(): bytes that are printable keep their code point; the others, in
// order, take U+0100, U+0101, ...
struct Alphabet {
  std::array<std::string, 256> symbols;
  std::array<int, 512> bytes;  // by code point; -1 outside the alphabet (all are below U+0200)

  Alphabet() {
    bytes.fill(-1);
    const auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int shifted = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t code_point = printable(b) ? b : 256 + shifted++;
      append_utf8(symbols[b], code_point);
      bytes[code_point] = b;
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet instance;
  return instance;
}

}  // namespace

const std::string& byte_to_symbol(unsigned char byte) { return alphabet().symbols[byte]; }

std::string bytes_to_symbols(std::string_view text) {
  const Alphabet& table = alphabet();
  std::string out;
  out.reserve(text.size() * 2);
  for (const char c : text) out += table.symbols[static_cast<unsigned char>(c)];
  return out;
}

std::optional<unsigned char> symbol_to_byte(char32_t code_point) {
  if (code_point >= 512) return std::nullopt;
  const int byte = alphabet().bytes[code_point];
  if (byte < 0) return std::nullopt;
  return static_cast<unsigned char>(byte);
}

}  // namespace pipetrain::tokenizer
