#include "data/tokenizer/token_decoder.h"

#include <nlohmann/json.hpp>
#include <stdexcept>

#include "data/tokenizer/byte_level.h"
#include "data/tokenizer/regex.h"
#include "data/tokenizer/utf8.h"

namespace pipetrain::tokenizer {

namespace {

// Byte-level symbols back to the bytes they stand for, all tokens into one text; a token with a
// character outside the alphabet (an added token's own text) is kept as it is.
class ByteLevel : public TokenDecoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& token : tokens) {
      std::string token_bytes;
      bool in_alphabet = true;
      for (size_t at = 0; at < token.size() && in_alphabet;) {
        const auto byte = symbol_to_byte(next_code_point(token, at));
        if (byte) {
          token_bytes += static_cast<char>(*byte);
        } else {
          in_alphabet = false;
        }
      }
      bytes += in_alphabet ? token_bytes : token;
    }
    tokens = {to_valid_utf8(bytes)};
  }
};

class Metaspace : public TokenDecoder {
 public:
  Metaspace(std::string replacement, bool drops_first)
      : replacement_(std::move(replacement)), drops_first_(drops_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& token = tokens[i];
      for (size_t at = 0; at < token.size();) {
        if (token.compare(at, replacement_.size(), replacement_) == 0) {
          // The first token's symbols were prepended by the pre-tokenizer (where it prepends).
          if (!(i == 0 && drops_first_)) out += ' ';
          at += replacement_.size();
        } else {
          out += token[at++];
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool drops_first_;
};

// Runs of <0x..> tokens back to their bytes: their text where the run is UTF-8, else a U+FFFD
// for each byte.
class ByteFallback : public TokenDecoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string run;
    size_t run_length = 0;
    const auto flush = [&] {
      if (run_length == 0) return;
      if (!first_invalid_utf8(run)) {
        out.push_back(run);
      } else {
        for (size_t k = 0; k < run_length; ++k) out.emplace_back("\xEF\xBF\xBD");
      }
      run.clear();
      run_length = 0;
    };
    for (std::string& token : tokens) {
      if (const auto byte = byte_of(token)) {
        run += static_cast<char>(*byte);
        ++run_length;
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    tokens = std::move(out);
  }

 private:
  static std::optional<unsigned char> byte_of(const std::string& token) {
    if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') {
      return std::nullopt;
    }
    const auto digit = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    const int high = digit(token[3]), low = digit(token[4]);
    if (high < 0 || low < 0) return std::nullopt;
    return static_cast<unsigned char>(high * 16 + low);
  }
};

class Fuse : public TokenDecoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const std::string& token : tokens) joined += token;
    tokens = {joined};
  }
};

// Up to `start` leading and `stop` trailing `content` characters off each token.
class Strip : public TokenDecoder {
 public:
  Strip(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      std::vector<char32_t> chars;
      for (size_t at = 0; at < token.size();) chars.push_back(next_code_point(token, at));
      size_t begin = 0, end = chars.size();
      while (begin < std::min(start_, chars.size()) && chars[begin] == content_) ++begin;
      for (size_t k = 0; k < stop_ && end > begin && chars[end - 1] == content_; ++k) --end;
      std::string out;
      for (size_t i = begin; i < end; ++i) append_utf8(out, chars[i]);
      token = std::move(out);
    }
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class Replace : public TokenDecoder {
 public:
  Replace(Regex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      token = pattern_.replace_all(token, content_);
    }
  }

 private:
  Regex pattern_;
  std::string content_;
};

class Sequence : public TokenDecoder {
 public:
  explicit Sequence(std::vector<std::unique_ptr<TokenDecoder>> steps) : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) step->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<TokenDecoder>> steps_;
};

char32_t single_character(const std::string& text, const char* what) {
  size_t at = 0;
  if (text.empty()) throw std::invalid_argument(std::string(what) + " is empty");
  const char32_t c = next_code_point(text, at);
  if (at != text.size()) {
    throw std::invalid_argument(std::string(what) + " '" + text + "' is not one character");
  }
  return c;
}

}  // namespace

std::unique_ptr<TokenDecoder> make_token_decoder(const nlohmann::json& config) {
  if (config.is_null()) return nullptr;
  const auto type = config.at("type").get<std::string>();
  if (type == "ByteLevel") return std::make_unique<ByteLevel>();
  if (type == "Metaspace") {
    const bool never = config.value("prepend_scheme", std::string("always")) == "never" ||
                       (config.contains("add_prefix_space") && config["add_prefix_space"] == false);
    return std::make_unique<Metaspace>(config.value("replacement", std::string("\u2581")), !never);
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Strip") {
    const auto content = config.at("content").get<std::string>();
    return std::make_unique<Strip>(single_character(content, "the Strip decoder's content"),
                                   config.at("start").get<size_t>(),
                                   config.at("stop").get<size_t>());
  }
  if (type == "Replace") {
    return std::make_unique<Replace>(pattern_of(config.at("pattern")),
                                     config.at("content").get<std::string>());
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<TokenDecoder>> steps;
    for (const auto& step : config.at("decoders")) steps.push_back(make_token_decoder(step));
    return std::make_unique<Sequence>(std::move(steps));
  }
  throw std::invalid_argument(
      "the decoder '" + type +
      "' is not implemented (pipetrain has ByteLevel, Metaspace, ByteFallback, Fuse, Strip, "
      "Replace, Sequence)");
}

}  // namespace pipetrain::tokenizer
