#include "data/tokenizer/normalizer.h"

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "data/tokenizer/regex.h"
#include "data/tokenizer/unicode.h"
#include "data/tokenizer/utf8.h"

namespace pipetrain::tokenizer {

namespace {

// NFC, NFD, NFKC, NFKD.
class UnicodeForm : public Normalizer {
 public:
  explicit UnicodeForm(NormalForm form) : form_(form) {}
  void apply(std::string& text) const override { text = normalized(text, form_); }

 private:
  NormalForm form_;
};

// Rust's char::to_lowercase, a code point at a time: the simple mapping, and U+0130's full one.
class Lowercase : public Normalizer {
 public:
  void apply(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (size_t at = 0; at < text.size();) {
      const char32_t c = next_code_point(text, at);
      if (c == 0x130) {  // LATIN CAPITAL LETTER I WITH DOT ABOVE -> i + COMBINING DOT ABOVE
        append_utf8(out, 'i');
        append_utf8(out, 0x307);
      } else {
        append_utf8(out, simple_lowercase(c));
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
  void apply(std::string& text) const override { text = pattern_.replace_all(text, content_); }

 private:
  Regex pattern_;
  std::string content_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  void apply(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void apply(std::string& text) const override {
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
  void apply(std::string& text) const override {
    std::string out;
    for (size_t at = 0; at < text.size();) {
      const char32_t c = next_code_point(text, at);
      if (!is_nonspacing_mark(c)) append_utf8(out, c);
    }
    text = std::move(out);
  }
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& config) {
  if (config.is_null()) return nullptr;
  const auto type = config.at("type").get<std::string>();
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD" || type == "Lowercase" ||
      type == "StripAccents") {
    require_unicode_data("the normalizer " + type);
  }
  if (type == "NFC") return std::make_unique<UnicodeForm>(NormalForm::kNfc);
  if (type == "NFD") return std::make_unique<UnicodeForm>(NormalForm::kNfd);
  if (type == "NFKC") return std::make_unique<UnicodeForm>(NormalForm::kNfkc);
  if (type == "NFKD") return std::make_unique<UnicodeForm>(NormalForm::kNfkd);
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
    return std::make_unique<Sequence<std::string>>(config.at("normalizers"), make_normalizer);
  }
  refuse_unimplemented(
      "normalizer", type,
      "NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, Strip, StripAccents, Sequence");
}

}  // namespace pipetrain::tokenizer
