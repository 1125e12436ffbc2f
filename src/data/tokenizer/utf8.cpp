#include "data/tokenizer/utf8.h"

namespace pipetrain::tokenizer {

namespace {

// The length of the well-formed sequence at `bytes[at]`, or, for an ill-formed one, minus the
// length of its maximal subpart (the bytes a replacement character stands for).
long sequence_length(const unsigned char* bytes, size_t size, size_t at) {
  const unsigned char lead = bytes[at];
  if (lead < 0x80) return 1;
  // The length of the sequence, and the range its second byte must lie in (which rules out
  // overlong forms, surrogates and code points above U+10FFFF, as RFC 3629's table does).
  size_t length;
  unsigned char low = 0x80, high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return -1;
  }
  for (size_t k = 1; k < length; ++k) {
    const bool continues = at + k < size && (k == 1 ? bytes[at + k] >= low && bytes[at + k] <= high
                                                    : (bytes[at + k] & 0xC0) == 0x80);
    if (!continues) return -static_cast<long>(k);
  }
  return static_cast<long>(length);
}

}  // namespace

std::optional<size_t> first_invalid_utf8(std::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t at = 0; at < text.size();) {
    const long length = sequence_length(bytes, text.size(), at);
    if (length < 0) return at;
    at += static_cast<size_t>(length);
  }
  return std::nullopt;
}

std::string to_valid_utf8(std::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  std::string out;
  out.reserve(text.size());
  for (size_t at = 0; at < text.size();) {
    const long length = sequence_length(bytes, text.size(), at);
    if (length > 0) {
      out.append(text.substr(at, static_cast<size_t>(length)));
      at += static_cast<size_t>(length);
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
      at += static_cast<size_t>(-length);
    }
  }
  return out;
}

char32_t next_code_point(std::string_view text, size_t& at) {
  const auto lead = static_cast<unsigned char>(text[at]);
  if (lead < 0x80) {
    ++at;
    return lead;
  }
  const size_t length = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
  char32_t code_point = lead & (0x7F >> length);
  for (size_t k = 1; k < length; ++k) {
    code_point = (code_point << 6) | (static_cast<unsigned char>(text[at + k]) & 0x3F);
  }
  at += length;
  return code_point;
}

void append_utf8(std::string& out, char32_t code_point) {
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xE0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
}

}  // namespace pipetrain::tokenizer
