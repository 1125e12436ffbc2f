#include "data/tokenizer/chat_template_lexer.h"

#include <cctype>
#include <cstdlib>

namespace pipetrain::jinja {

namespace {

// Jinja reads "\r\n" and "\r" as "\n" everywhere in a template, literals included.
std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  return out;
}

// The length in bytes of the Python whitespace code point at text[i], 0 if there is none.
size_t space_at(std::string_view text, size_t i) {
  const auto byte = static_cast<unsigned char>(text[i]);
  if (byte < 0x80) return is_python_space(byte) ? 1 : 0;
  size_t length = (byte & 0xe0) == 0xc0 ? 2 : (byte & 0xf0) == 0xe0 ? 3 : 4;
  if (i + length > text.size()) return 0;
  const std::u32string c = decode_utf8(text.substr(i, length), Position{});
  return c.size() == 1 && is_python_space(c[0]) ? length : 0;
}

size_t skip_spaces(std::string_view text, size_t i) {
  while (i < text.size()) {
    const size_t length = space_at(text, i);
    if (length == 0) break;
    i += length;
  }
  return i;
}

// Python's str.rstrip(): whitespace code points at the end.
std::string_view rstrip(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xc0) == 0x80) --start;
    if (space_at(text, start) != end - start) break;
    end = start;
  }
  return text.substr(0, end);
}

class Lexer {
 public:
  explicit Lexer(std::string source) : source_(std::move(source)) {
    // keep_trailing_newline is off: the template's last newline is not output.
    if (!source_.empty() && source_.back() == '\n') source_.pop_back();
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;  // whether the text before the next tag begins a line
    while (pos < source_.size()) {
      const size_t tag = find_tag(pos);
      std::string_view text = std::string_view(source_).substr(pos, tag - pos);
      if (tag == std::string::npos) {
        emit_text(text, pos);
        break;
      }
      const char kind = source_[tag + 1];  // '{', '%' or '#'
      const char sign = tag + 2 < source_.size() ? source_[tag + 2] : '\0';
      if (sign == '-') {
        text = rstrip(text);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: a block or comment tag alone on its line takes the line's indent.
        const size_t line_start = text.rfind('\n') + 1;  // npos + 1 == 0
        if ((line_start > 0 || line_starting) && skip_spaces(text, line_start) == text.size()) {
          text = text.substr(0, line_start);
        }
      }
      emit_text(text, pos);
      const size_t inside = tag + 2 + (sign == '-' || sign == '+' ? 1 : 0);
      pos = kind == '#' ? skip_comment(tag, inside) : lex_tag(tag, inside, kind);
      line_starting = pos > 0 && source_[pos - 1] == '\n';
    }
    tokens_.push_back(Token{Token::Type::End, "", position(source_.size())});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = source_.find('{', from); i != std::string::npos; i = source_.find('{', i + 1)) {
      if (i + 1 < source_.size() &&
          (source_[i + 1] == '{' || source_[i + 1] == '%' || source_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  // The line and column of `offset`, counted on from the last offset asked for (the lexer asks in
  // increasing order, but for a tag's text before it).
  Position position(size_t offset) {
    if (offset < counted_offset_) {
      counted_offset_ = 0;
      counted_ = Position{};
    }
    for (; counted_offset_ < offset && counted_offset_ < source_.size(); ++counted_offset_) {
      const char c = source_[counted_offset_];
      if (c == '\n') {
        ++counted_.line;
        counted_.column = 1;
      } else if ((static_cast<unsigned char>(c) & 0xc0) != 0x80) {
        ++counted_.column;  // a code point's first byte
      }
    }
    return counted_;
  }

  void emit_text(std::string_view text, size_t offset) {
    if (!text.empty())
      tokens_.push_back(Token{Token::Type::Text, std::string(text), position(offset)});
  }

  // After a block or comment end: `-` strips the whitespace that follows, trim_blocks the one
  // newline, `+` neither.
  size_t after_end(size_t end, char sign, bool block) const {
    if (sign == '-') return skip_spaces(source_, end);
    if (block && sign != '+' && end < source_.size() && source_[end] == '\n') return end + 1;
    return end;
  }

  size_t skip_comment(size_t tag, size_t inside) {
    const size_t close = source_.find("#}", inside);
    if (close == std::string::npos) refuse(position(tag), "unclosed comment: '{#' without '#}'");
    const char sign = close > inside && (source_[close - 1] == '-' || source_[close - 1] == '+')
                          ? source_[close - 1]
                          : '\0';
    return after_end(close + 2, sign, true);
  }

  // The tokens of a `{{ ... }}` or `{% ... %}` tag; returns the offset after it.
  size_t lex_tag(size_t tag, size_t pos, char kind) {
    const bool block = kind == '%';
    tokens_.push_back(Token{block ? Token::Type::BlockBegin : Token::Type::VariableBegin,
                            block ? "{%" : "{{", position(tag)});
    const size_t first_token = tokens_.size();
    int open_brackets = 0;  // inside brackets `}}` closes a dict literal, not the tag
    const std::string end = block ? "%}" : "}}";
    while (true) {
      pos = skip_spaces(source_, pos);
      if (pos >= source_.size()) {
        refuse(position(tag),
               std::string("unclosed tag: '") + (block ? "{%" : "{{") + "' without '" + end + "'");
      }
      if (open_brackets == 0) {
        const char sign = source_[pos];
        const size_t marker = (sign == '-' || (block && sign == '+')) ? pos + 1 : pos;
        if (source_.compare(marker, 2, end) == 0) {
          tokens_.push_back(
              Token{block ? Token::Type::BlockEnd : Token::Type::VariableEnd, end, position(pos)});
          if (block && tokens_.size() > first_token &&
              tokens_[first_token].type == Token::Type::Name &&
              tokens_[first_token].value == "raw") {
            refuse(tokens_[first_token].position, "the statement 'raw' is not supported");
          }
          return after_end(marker + 2, marker == pos ? '\0' : sign, block);
        }
      }
      pos = lex_token(pos, open_brackets);
    }
  }

  size_t lex_token(size_t pos, int& open_brackets) {
    const Position at = position(pos);
    const char c = source_[pos];
    if (std::isdigit(static_cast<unsigned char>(c))) return lex_number(pos, at);
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t end = pos;
      while (end < source_.size() &&
             (std::isalnum(static_cast<unsigned char>(source_[end])) || source_[end] == '_')) {
        ++end;
      }
      tokens_.push_back(Token{Token::Type::Name, source_.substr(pos, end - pos), at});
      return end;
    }
    if (c == '\'' || c == '"') return lex_string(pos, at);
    static const char* const kOperators[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                             "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                             "<",  ">",  "=",  ".",  ":",  "|",  ",", ";"};
    for (const char* op : kOperators) {
      if (source_.compare(pos, std::char_traits<char>::length(op), op) == 0) {
        const std::string text = op;
        if (text == "(" || text == "[" || text == "{") ++open_brackets;
        if (text == ")" || text == "]" || text == "}") {
          if (open_brackets == 0) refuse(at, "unexpected '" + text + "'");
          --open_brackets;
        }
        tokens_.push_back(Token{Token::Type::Operator, text, at});
        return pos + text.size();
      }
    }
    refuse(at, std::string("unexpected character '") + c + "'");
  }

  size_t lex_number(size_t pos, Position at) {
    auto digits = [&](size_t i) {
      while (i < source_.size() && (std::isdigit(static_cast<unsigned char>(source_[i])) ||
                                    (source_[i] == '_' && i + 1 < source_.size() &&
                                     std::isdigit(static_cast<unsigned char>(source_[i + 1]))))) {
        ++i;
      }
      return i;
    };
    size_t end = digits(pos);
    bool is_float = false;
    // After a dot (`messages.0.role`) digits are an index, never a float's fraction.
    const bool after_dot = pos > 0 && source_[pos - 1] == '.';
    if (!after_dot && end + 1 < source_.size() && source_[end] == '.' &&
        std::isdigit(static_cast<unsigned char>(source_[end + 1]))) {
      end = digits(end + 1);
      is_float = true;
    }
    if (!after_dot && end < source_.size() && (source_[end] == 'e' || source_[end] == 'E')) {
      size_t exponent = end + 1;
      if (exponent < source_.size() && (source_[exponent] == '+' || source_[exponent] == '-')) {
        ++exponent;
      }
      if (exponent < source_.size() &&
          std::isdigit(static_cast<unsigned char>(source_[exponent]))) {
        end = digits(exponent);
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = pos; i < end; ++i) {
      if (source_[i] != '_') text += source_[i];
    }
    Token token{is_float ? Token::Type::Float : Token::Type::Integer, text, at};
    if (is_float) {
      token.number = std::strtod(text.c_str(), nullptr);
    } else {
      errno = 0;
      token.integer = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) refuse(at, "the integer " + text + " does not fit 64 bits");
    }
    tokens_.push_back(std::move(token));
    return end;
  }

  static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // A string literal, its escapes read as Python's "unicode-escape" codec reads them (Jinja's
  // way); an unknown escape such as "\d" stays as written.
  size_t lex_string(size_t pos, Position at) {
    const char quote = source_[pos];
    std::string value;
    size_t i = pos + 1;
    while (true) {
      if (i >= source_.size()) refuse(at, "unclosed string literal");
      const char c = source_[i];
      if (c == quote) break;
      if (c != '\\' || i + 1 >= source_.size()) {
        value += c;
        ++i;
        continue;
      }
      const char escaped = source_[i + 1];
      i += 2;
      switch (escaped) {
        case '\n':  // a line continuation
          break;
        case '\\':
        case '\'':
        case '"':
          value += escaped;
          break;
        case 'a':
          value += '\a';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'n':
          value += '\n';
          break;
        case 'r':
          value += '\r';
          break;
        case 't':
          value += '\t';
          break;
        case 'v':
          value += '\v';
          break;
        case 'x':
        case 'u':
        case 'U': {
          const int count = escaped == 'x' ? 2 : escaped == 'u' ? 4 : 8;
          char32_t code = 0;
          for (int k = 0; k < count; ++k, ++i) {
            if (i >= source_.size() || hex_value(source_[i]) < 0) {
              refuse(at, std::string("truncated \\") + escaped + " escape in a string literal");
            }
            code = code * 16 + hex_value(source_[i]);
          }
          if (code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) {
            refuse(at, "a string literal's \\" + std::string(1, escaped) +
                           " escape is not a Unicode scalar value");
          }
          value += encode_utf8(std::u32string(1, code));
          break;
        }
        case 'N':
          refuse(at, "named Unicode escapes (\\N{...}) are not supported");
        default:
          if (escaped >= '0' && escaped <= '7') {  // up to three octal digits
            char32_t code = escaped - '0';
            for (int k = 0; k < 2 && i < source_.size() && source_[i] >= '0' && source_[i] <= '7';
                 ++k, ++i) {
              code = code * 8 + (source_[i] - '0');
            }
            value += encode_utf8(std::u32string(1, code));
          } else {
            value += '\\';
            value += escaped;
          }
      }
    }
    tokens_.push_back(Token{Token::Type::String, std::move(value), at});
    return i + 1;
  }

  std::string source_;
  std::vector<Token> tokens_;
  size_t counted_offset_ = 0;
  Position counted_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) {
  return Lexer(normalize_newlines(source)).run();
}

}  // namespace pipetrain::jinja
