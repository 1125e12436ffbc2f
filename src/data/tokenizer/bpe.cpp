#include "data/tokenizer/bpe.h"

#include <atomic>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>
#include <stdexcept>

#include "data/tokenizer/utf8.h"

namespace pipetrain::tokenizer {

namespace {

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// The pieces a thread tokenized lately and their ids: text repeats its words, and merging is
// most of BPE's time. One model's at a time, per thread, so threads never wait on each other.
struct WordCache {
  static constexpr size_t kCapacity = 1 << 16;
  static constexpr size_t kLongestWord = 256;  // bytes; longer pieces are rare and not kept
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>> words;
};

WordCache& thread_cache(uint64_t owner) {
  thread_local WordCache cache;
  if (cache.owner != owner) {
    cache.words.clear();
    cache.owner = owner;
  }
  return cache;
}

std::atomic<uint64_t> next_cache_owner{1};

std::string optional_string(const nlohmann::json& model, const char* key) {
  const auto it = model.find(key);
  if (it == model.end() || it->is_null()) return "";
  return it->get<std::string>();
}

}  // namespace

Bpe::Bpe(const nlohmann::json& model) : cache_owner_(next_cache_owner++) {
  const auto dropout = model.find("dropout");
  if (dropout != model.end() && !dropout->is_null() && dropout->get<double>() != 0.0) {
    throw std::invalid_argument("BPE dropout " + dropout->dump() +
                                " tokenizes at random; pipetrain encodes deterministically only");
  }
  const auto& vocab = model.at("vocab");
  int64_t largest = -1;
  for (const auto& [token, id] : vocab.items()) largest = std::max(largest, id.get<int64_t>());
  tokens_.resize(static_cast<size_t>(largest + 1));
  for (const auto& [token, id] : vocab.items()) tokens_[id.get<size_t>()] = token;
  ids_.reserve(tokens_.size());
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (!tokens_[id].empty()) ids_.emplace(tokens_[id], static_cast<int32_t>(id));
  }

  const std::string unk = optional_string(model, "unk_token");
  if (!unk.empty()) unk_token_ = unk;
  continuing_subword_prefix_ = optional_string(model, "continuing_subword_prefix");
  end_of_word_suffix_ = optional_string(model, "end_of_word_suffix");
  fuse_unk_ = model.value("fuse_unk", false);
  byte_fallback_ = model.value("byte_fallback", false);
  ignore_merges_ = model.value("ignore_merges", false);

  const auto id_of = [&](const std::string& token) {
    const auto it = ids_.find(token);
    if (it == ids_.end()) {
      throw std::invalid_argument("a BPE merge names '" + token +
                                  "', which is not in the vocabulary");
    }
    return it->second;
  };
  const auto& merges = model.at("merges");
  merges_.reserve(merges.size());
  int32_t rank = 0;
  for (const auto& merge : merges) {
    // Older files write a merge as "left right", newer ones as ["left", "right"].
    std::string left, right;
    if (merge.is_array() && merge.size() == 2) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else if (merge.is_string()) {
      const auto text = merge.get<std::string>();
      const auto space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        throw std::invalid_argument("the BPE merge '" + text + "' is not two tokens");
      }
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else {
      throw std::invalid_argument("the BPE merge " + merge.dump() + " is not two tokens");
    }
    // The merged token drops the right part's continuing-subword prefix.
    const std::string merged =
        left + right.substr(std::min(continuing_subword_prefix_.size(), right.size()));
    merges_[pair_key(id_of(left), id_of(right))] = Merge{rank++, id_of(merged)};
  }
}

std::optional<int64_t> Bpe::token_to_id(std::string_view token) const {
  const auto it = ids_.find(token);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

const std::string* Bpe::id_to_token(int64_t id) const {
  if (id < 0 || id >= vocab_size() || tokens_[static_cast<size_t>(id)].empty()) return nullptr;
  return &tokens_[static_cast<size_t>(id)];
}

const Bpe::Merge* Bpe::merge_of(int32_t left, int32_t right) const {
  const auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void Bpe::tokenize(std::string_view piece, std::vector<int64_t>& ids) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (const auto id = token_to_id(piece)) {
      ids.push_back(*id);
      return;
    }
  }
  const bool cacheable = piece.size() <= WordCache::kLongestWord;
  WordCache& cache = thread_cache(cache_owner_);
  if (cacheable) {
    const auto hit = cache.words.find(std::string(piece));
    if (hit != cache.words.end()) {
      ids.insert(ids.end(), hit->second.begin(), hit->second.end());
      return;
    }
  }
  std::vector<int32_t> merged = merge_piece(piece);
  ids.insert(ids.end(), merged.begin(), merged.end());
  if (cacheable) {
    if (cache.words.size() >= WordCache::kCapacity) cache.words.clear();
    cache.words.emplace(std::string(piece), std::move(merged));
  }
}

std::vector<int32_t> Bpe::merge_piece(std::string_view piece) const {
  // A doubly linked list of symbols, merged in place.
  struct Symbol {
    int32_t id;
    int prev, next;
    bool removed = false;
  };
  std::vector<Symbol> symbols;
  const auto add = [&](int32_t id) {
    const int at = static_cast<int>(symbols.size());
    symbols.push_back({id, at - 1, at + 1});
  };

  // One symbol per character (its id with the prefix and suffix the options ask for); what the
  // vocabulary lacks becomes byte tokens, or the unknown token, or, without either, nothing, as
  // in Hugging Face's tokenizers.
  int32_t pending_unk = -1;  // an unknown token not yet added (fuse_unk extends it)
  for (size_t at = 0; at < piece.size();) {
    const size_t begin = at;
    next_code_point(piece, at);
    std::string symbol;
    if (begin > 0) symbol += continuing_subword_prefix_;
    symbol += piece.substr(begin, at - begin);
    if (at == piece.size()) symbol += end_of_word_suffix_;
    if (const auto id = ids_.find(symbol); id != ids_.end()) {
      if (pending_unk >= 0) add(pending_unk);
      pending_unk = -1;
      add(id->second);
      continue;
    }
    if (byte_fallback_) {
      std::vector<int32_t> bytes;
      for (const char c : symbol) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", static_cast<unsigned char>(c));
        const auto id = ids_.find(name);
        if (id == ids_.end()) break;
        bytes.push_back(id->second);
      }
      if (bytes.size() == symbol.size()) {
        for (const int32_t id : bytes) add(id);
        continue;
      }
    }
    if (unk_token_) {
      const auto unk = ids_.find(*unk_token_);
      if (unk == ids_.end()) {
        throw std::invalid_argument("the BPE unk_token '" + *unk_token_ +
                                    "' is not in the vocabulary");
      }
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = unk->second;
    }
  }
  if (pending_unk >= 0) add(pending_unk);
  if (symbols.empty()) return {};
  symbols.back().next = -1;

  // Lowest rank first, then leftmost: Hugging Face's order.
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t merged_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* merge = merge_of(symbols[i].id, symbols[i + 1].id)) {
      queue.push({merge->rank, static_cast<int>(i), merge->merged_id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(top.pos)];
    if (left.removed || left.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    // A candidate whose pair has changed since it was queued is stale.
    const Merge* current = merge_of(left.id, right.id);
    if (current == nullptr || current->merged_id != top.merged_id) continue;
    left.id = top.merged_id;
    right.removed = true;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    if (left.prev >= 0) {
      if (const Merge* merge = merge_of(symbols[static_cast<size_t>(left.prev)].id, left.id)) {
        queue.push({merge->rank, left.prev, merge->merged_id});
      }
    }
    if (left.next >= 0) {
      if (const Merge* merge = merge_of(left.id, symbols[static_cast<size_t>(left.next)].id)) {
        queue.push({merge->rank, top.pos, merge->merged_id});
      }
    }
  }
  std::vector<int32_t> ids;
  for (const Symbol& symbol : symbols) {
    if (!symbol.removed) ids.push_back(symbol.id);
  }
  return ids;
}

}  // namespace pipetrain::tokenizer
