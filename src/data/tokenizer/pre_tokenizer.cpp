#include "data/tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "data/tokenizer/byte_level.h"
#include "data/tokenizer/regex.h"
#include "data/tokenizer/unicode.h"

namespace pipetrain::tokenizer {

namespace {

// What becomes of a pattern's matches (Hugging Face's SplitDelimiterBehavior).
enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior behavior_of(const std::string& name) {
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  throw std::invalid_argument("the split behavior '" + name + "' is unknown");
}

struct Span {
  size_t begin, end;
  bool is_match;
};

// `text` as consecutive spans, each a match of `pattern` (flipped where `invert`) or not.
std::vector<Span> spans_of(const Regex& pattern, const std::string& text, bool invert) {
  std::vector<Span> spans;
  size_t previous = 0;
  for (const auto& [begin, end] : pattern.find_all(text)) {
    if (begin == end) continue;  // an empty match cuts nothing
    if (previous < begin) spans.push_back({previous, begin, invert});
    spans.push_back({begin, end, !invert});
    previous = end;
  }
  if (previous < text.size()) spans.push_back({previous, text.size(), invert});
  return spans;
}

// The spans grouped into pieces as `behavior` says; each pair is a piece's [begin, end).
std::vector<std::pair<size_t, size_t>> group(const std::vector<Span>& spans, Behavior behavior) {
  std::vector<std::pair<size_t, size_t>> pieces;
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kRemoved:
      for (const Span& span : spans) {
        if (!span.is_match) pieces.emplace_back(span.begin, span.end);
      }
      break;
    case Behavior::kIsolated:
      for (const Span& span : spans) pieces.emplace_back(span.begin, span.end);
      break;
    case Behavior::kMergedWithPrevious:
      for (const Span& span : spans) {
        if (span.is_match && !previous_match && !pieces.empty()) {
          pieces.back().second = span.end;
        } else {
          pieces.emplace_back(span.begin, span.end);
        }
        previous_match = span.is_match;
      }
      break;
    case Behavior::kMergedWithNext:
      // As the previous case, from the end backwards.
      for (auto span = spans.rbegin(); span != spans.rend(); ++span) {
        if (span->is_match && !previous_match && !pieces.empty()) {
          pieces.back().first = span->begin;
        } else {
          pieces.emplace_back(span->begin, span->end);
        }
        previous_match = span->is_match;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
    case Behavior::kContiguous:
      for (size_t i = 0; i < spans.size(); ++i) {
        if (i > 0 && spans[i].is_match == previous_match) {
          pieces.back().second = spans[i].end;
        } else {
          pieces.emplace_back(spans[i].begin, spans[i].end);
        }
        previous_match = spans[i].is_match;
      }
      break;
  }
  return pieces;
}

// Each piece cut where `pattern` matches, as `behavior` says.
void split(std::vector<Piece>& pieces, const Regex& pattern, Behavior behavior,
           bool invert = false) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (Piece& piece : pieces) {
    for (const auto& [begin, end] : group(spans_of(pattern, piece.text, invert), behavior)) {
      if (begin == end) continue;
      out.push_back({piece.text.substr(begin, end - begin), piece.at_start && begin == 0});
    }
  }
  pieces = std::move(out);
}

class Split : public PreTokenizer {
 public:
  Split(Regex pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split(pieces, pattern_, behavior_, invert_);
  }

 private:
  Regex pattern_;
  Behavior behavior_;
  bool invert_;
};

// GPT-2's pre-tokenizer: optionally a space before each piece and GPT-2's expression, then every
// byte as its symbol of the byte-level alphabet.
class ByteLevel : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space),
        gpt2_pattern_(
            use_regex
                ? std::make_unique<Regex>(
                      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)")
                : nullptr) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    if (add_prefix_space_) {
      for (Piece& piece : pieces) {
        if (piece.text.empty() || piece.text[0] != ' ') piece.text.insert(0, " ");
      }
    }
    if (gpt2_pattern_) split(pieces, *gpt2_pattern_, Behavior::kIsolated);
    for (Piece& piece : pieces) piece.text = bytes_to_symbols(piece.text);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> gpt2_pattern_;
};

// SentencePiece's convention: spaces become the replacement symbol (U+2581 by default), one is
// prepended as the scheme says, and pieces begin at each symbol.
class Metaspace : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  Metaspace(std::string replacement, Prepend prepend, bool split)
      : replacement_(std::move(replacement)),
        prepend_(prepend),
        split_(split),
        replacement_pattern_(replacement_, true) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (Piece& piece : pieces) {
      std::string replaced;
      for (const char c : piece.text) {
        if (c == ' ') {
          replaced += replacement_;
        } else {
          replaced += c;
        }
      }
      const bool starts_with_symbol = replaced.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts_with_symbol &&
          (prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && piece.at_start))) {
        replaced.insert(0, replacement_);
      }
      piece.text = std::move(replaced);
    }
    if (split_) split(pieces, replacement_pattern_, Behavior::kMergedWithNext);
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
  Regex replacement_pattern_;
};

class Sequence : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& step : steps_) step->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

Metaspace::Prepend prepend_scheme_of(const nlohmann::json& config) {
  const auto scheme = config.value("prepend_scheme", std::string("always"));
  if (config.contains("add_prefix_space") && config.at("add_prefix_space") == false) {
    return Metaspace::Prepend::kNever;
  }
  if (scheme == "always") return Metaspace::Prepend::kAlways;
  if (scheme == "first") return Metaspace::Prepend::kFirst;
  if (scheme == "never") return Metaspace::Prepend::kNever;
  throw std::invalid_argument("the Metaspace prepend_scheme '" + scheme + "' is unknown");
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& config) {
  if (config.is_null()) return nullptr;
  const auto type = config.at("type").get<std::string>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (const auto& step : config.at("pretokenizers")) steps.push_back(make_pre_tokenizer(step));
    return std::make_unique<Sequence>(std::move(steps));
  }
  if (type == "Split") {
    return std::make_unique<Split>(pattern_of(config.at("pattern")),
                                   behavior_of(config.at("behavior").get<std::string>()),
                                   config.value("invert", false));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevel>(config.value("add_prefix_space", true),
                                       config.value("use_regex", true));
  }
  if (type == "Digits") {
    return std::make_unique<Split>(
        Regex(R"(\p{N})"),
        config.value("individual_digits", false) ? Behavior::kIsolated : Behavior::kContiguous,
        false);
  }
  if (type == "Metaspace") {
    return std::make_unique<Metaspace>(config.value("replacement", std::string("\u2581")),
                                       prepend_scheme_of(config), config.value("split", true));
  }
  if (type == "Whitespace") {
    const std::string word = kWordClass;
    return std::make_unique<Split>(Regex(word + "+|[^\\s" + word.substr(1) + "+"),
                                   Behavior::kRemoved, true);
  }
  if (type == "WhitespaceSplit") {
    return std::make_unique<Split>(Regex(R"(\s)"), Behavior::kRemoved, false);
  }
  if (type == "Punctuation") {
    return std::make_unique<Split>(Regex(R"([\p{P}!-/:-@\[-`{-~])"),
                                   behavior_of(config.value("behavior", std::string("Isolated"))),
                                   false);
  }
  throw std::invalid_argument(
      "the pre-tokenizer '" + type +
      "' is not implemented (pipetrain has Sequence, Split, ByteLevel, Digits, Metaspace, "
      "Whitespace, WhitespaceSplit, Punctuation)");
}

}  // namespace pipetrain::tokenizer
