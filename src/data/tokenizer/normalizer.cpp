#include "data/tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "data/tokenizer/regex.h"
#include "data/tokenizer/unicode.h"
#include "data/tokenizer/utf8.h"

namespace pipetrain::tokenizer {

namespace {

// NFC, NFD, NFKC, NFKD through utf8proc.
class UnicodeForm : public Normalizer {
 public:
  explicit UnicodeForm(utf8proc_option_t options) : options_(options) {}
  void normalize(std::string& text) const override {
    if (text.empty()) return;
    utf8proc_uint8_t* mapped = nullptr;
    const auto length = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                     static_cast<utf8proc_ssize_t>(text.size()), &mapped, options_);
    if (length < 0) {
      throw std::runtime_error(std::string("Unicode normalization failed: ") +
                               utf8proc_errmsg(length));
    }
    text.assign(reinterpret_cast<const char*>(mapped), static_cast<size_t>(length));
    std::free(mapped);
  }

 private:
  utf8proc_option_t options_;
};

// Rust's char::to_lowercase, a code point at a time: the simple mapping, and U+0130's full one.
class Lowercase : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (size_t at = 0; at < text.size();) {
      const char32_t c = next_code_point(text, at);
      if (c == 0x130) {  // LATIN CAPITAL LETTER I WITH DOT ABOVE -> i + COMBINING DOT ABOVE
        append_utf8(out, 'i');
        append_utf8(out, 0x307);
      } else {
        append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
      }
    }
    text = std::move(out);
  }
};

// Each match of a pattern (a string or a regular expression) replaced by `content`, as is.
class Replace : public Normalizer {
 public:
  Replace(Regex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& text) const override { text = pattern_.replace_all(text, content_); }

 private:
  Regex pattern_;
  std::string content_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < text.size()) {
        size_t next = begin;
        if (!is_whitespace(next_code_point(text, next))) break;
        begin = next;
      }
    }
    if (right_) {
      size_t last_kept_end = begin;
      for (size_t at = begin; at < text.size();) {
        if (!is_whitespace(next_code_point(text, at))) last_kept_end = at;
      }
      end = last_kept_end;
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class StripAccents : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    std::string out;
    for (size_t at = 0; at < text.size();) {
      const char32_t c = next_code_point(text, at);
      if (!is_nonspacing_mark(c)) append_utf8(out, c);
    }
    text = std::move(out);
  }
};

class Sequence : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void normalize(std::string& text) const override {
    for (const auto& step : steps_) step->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& config) {
  if (config.is_null()) return nullptr;
  const auto type = config.at("type").get<std::string>();
  const auto form = [](int options) {
    return std::make_unique<UnicodeForm>(static_cast<utf8proc_option_t>(UTF8PROC_STABLE | options));
  };
  if (type == "NFC") return form(UTF8PROC_COMPOSE);
  if (type == "NFD") return form(UTF8PROC_DECOMPOSE);
  if (type == "NFKC") return form(UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  if (type == "NFKD") return form(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Replace") {
    return std::make_unique<Replace>(pattern_of(config.at("pattern")),
                                     config.at("content").get<std::string>());
  }
  if (type == "Prepend") return std::make_unique<Prepend>(config.at("prepend").get<std::string>());
  if (type == "Strip") {
    return std::make_unique<Strip>(config.value("strip_left", true),
                                   config.value("strip_right", true));
  }
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const auto& step : config.at("normalizers")) steps.push_back(make_normalizer(step));
    return std::make_unique<Sequence>(std::move(steps));
  }
  throw std::invalid_argument("the normalizer '" + type +
                              "' is not implemented (pipetrain has NFC, NFD, NFKC, NFKD, "
                              "Lowercase, Replace, Prepend, Strip, StripAccents, Sequence)");
}

}  // namespace pipetrain::tokenizer
