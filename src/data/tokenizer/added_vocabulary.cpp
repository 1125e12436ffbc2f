#include "data/tokenizer/added_vocabulary.h"

#include <nlohmann/json.hpp>

#include "data/tokenizer/bpe.h"
#include "data/tokenizer/normalizer.h"
#include "data/tokenizer/unicode.h"
#include "data/tokenizer/utf8.h"

namespace pipetrain::tokenizer {

void AddedVocabulary::Trie::insert(const std::string& pattern, int token) {
  int node = 0;
  for (const char c : pattern) {
    const auto byte = static_cast<unsigned char>(c);
    auto child = nodes[static_cast<size_t>(node)].children.find(byte);
    if (child == nodes[static_cast<size_t>(node)].children.end()) {
      nodes.emplace_back();
      child = nodes[static_cast<size_t>(node)]
                  .children.emplace(byte, static_cast<int>(nodes.size() - 1))
                  .first;
    }
    node = child->second;
  }
  nodes[static_cast<size_t>(node)].token = token;
}

std::optional<std::pair<int, size_t>> AddedVocabulary::Trie::longest_at(std::string_view text,
                                                                        size_t at) const {
  std::optional<std::pair<int, size_t>> longest;
  int node = 0;
  for (size_t i = at; i < text.size(); ++i) {
    const auto& children = nodes[static_cast<size_t>(node)].children;
    const auto child = children.find(static_cast<unsigned char>(text[i]));
    if (child == children.end()) break;
    node = child->second;
    if (nodes[static_cast<size_t>(node)].token >= 0) {
      longest.emplace(nodes[static_cast<size_t>(node)].token, i + 1 - at);
    }
  }
  return longest;
}

AddedVocabulary::AddedVocabulary(const nlohmann::json& added_tokens, const Bpe& model,
                                 const Normalizer* normalizer)
    : word_character_(std::string("\\A") + kWordClass + "\\z") {
  if (added_tokens.is_null()) return;
  // Ids as Hugging Face's tokenizers give them, whatever the file says: a token the model's
  // vocabulary (or an earlier added token) has keeps that id; the others are numbered on from
  // the model's vocabulary size. Hub files agree with this; one that does not is read as the
  // reference reads it.
  int64_t next_id = model.entry_count();
  for (const auto& entry : added_tokens) {
    Token token{0,
                entry.at("content").get<std::string>(),
                entry.value("single_word", false),
                entry.value("lstrip", false),
                entry.value("rstrip", false),
                entry.value("normalized", true),
                entry.value("special", false),
                ""};
    if (token.content.empty()) continue;
    if (const auto known = by_content_.find(token.content); known != by_content_.end()) {
      token.id = known->second;
    } else if (const auto model_id = model.token_to_id(token.content)) {
      token.id = static_cast<int32_t>(*model_id);
    } else {
      token.id = static_cast<int32_t>(next_id++);
    }
    // A normalized token is matched in its normalized form (and decoded as written).
    token.text = token.content;
    if (token.normalized && normalizer != nullptr) normalizer->normalize(token.text);
    const int index = static_cast<int>(tokens_.size());
    (token.normalized ? normalized_ : raw_).insert(token.text, index);
    by_id_[token.id] = tokens_.size();
    by_content_[token.content] = token.id;
    id_end_ = std::max<int64_t>(id_end_, int64_t{token.id} + 1);
    tokens_.push_back(std::move(token));
  }
}

bool AddedVocabulary::is_word_at_end(std::string_view text) const {
  if (text.empty()) return false;
  size_t begin = text.size() - 1;
  while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
  return word_character_.search(text.substr(begin));
}

bool AddedVocabulary::is_word_at_start(std::string_view text) const {
  if (text.empty()) return false;
  size_t end = 0;
  next_code_point(text, end);
  return word_character_.search(text.substr(0, end));
}

std::vector<std::pair<std::pair<size_t, size_t>, int>> AddedVocabulary::find(
    std::string_view text, const Trie& trie) const {
  std::vector<std::pair<std::pair<size_t, size_t>, int>> matches;
  size_t previous_end = 0;
  for (size_t at = 0; at < text.size();) {
    const auto found = trie.longest_at(text, at);
    if (!found) {
      ++at;
      continue;
    }
    const auto [index, length] = *found;
    const Token& token = tokens_[static_cast<size_t>(index)];
    size_t begin = at, end = at + length;
    at = end;  // the next search starts after this match, whether or not it is kept
    if (token.single_word &&
        (is_word_at_end(text.substr(0, begin)) || is_word_at_start(text.substr(end)))) {
      continue;  // the search goes on after it, as Hugging Face's matcher does
    }
    if (token.lstrip) {
      // Back over the whitespace before the token, but not into an earlier match.
      size_t stripped = begin;
      while (stripped > previous_end) {
        size_t char_begin = stripped - 1;
        while (char_begin > 0 && (static_cast<unsigned char>(text[char_begin]) & 0xC0) == 0x80) {
          --char_begin;
        }
        size_t probe = char_begin;
        if (!is_whitespace(next_code_point(text, probe))) break;
        stripped = char_begin;
      }
      begin = stripped;
    }
    if (token.rstrip) {
      while (end < text.size()) {
        size_t probe = end;
        if (!is_whitespace(next_code_point(text, probe))) break;
        end = probe;
      }
      at = end;
    }
    matches.push_back({{begin, end}, index});
    previous_end = end;
  }
  return matches;
}

void AddedVocabulary::split(std::vector<Segment>& segments, bool normalized) const {
  const Trie& trie = normalized ? normalized_ : raw_;
  if (trie.nodes.size() == 1) return;
  std::vector<Segment> out;
  out.reserve(segments.size());
  for (Segment& segment : segments) {
    if (segment.id) {
      out.push_back(std::move(segment));
      continue;
    }
    size_t previous = 0;
    const std::string& text = segment.text;
    for (const auto& [span, index] : find(text, trie)) {
      if (previous < span.first) {
        out.push_back({text.substr(previous, span.first - previous), std::nullopt,
                       segment.at_start && previous == 0});
      }
      out.push_back({text.substr(span.first, span.second - span.first),
                     tokens_[static_cast<size_t>(index)].id, segment.at_start && span.first == 0});
      previous = span.second;
    }
    if (previous < text.size()) {
      out.push_back({text.substr(previous), std::nullopt, segment.at_start && previous == 0});
    }
  }
  segments = std::move(out);
}

std::optional<int32_t> AddedVocabulary::token_to_id(std::string_view content) const {
  const auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

const std::string* AddedVocabulary::id_to_token(int64_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second].content;
}

bool AddedVocabulary::is_special(int64_t id) const {
  const auto it = by_id_.find(id);
  return it != by_id_.end() && tokens_[it->second].special;
}

}  // namespace pipetrain::tokenizer
