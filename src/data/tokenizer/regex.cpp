#include "data/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>
#include <stdexcept>

namespace pipetrain::tokenizer {

namespace {

// One match data per thread, since a match writes into it and Tokenizer::encode may run on many
// threads at once; only the whole match is read, so one pair of offsets is enough.
pcre2_match_data* thread_match_data() {
  struct Holder {
    pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
    ~Holder() { pcre2_match_data_free(data); }
  };
  thread_local Holder holder;
  return holder.data;
}

}  // namespace

struct Regex::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() { pcre2_code_free(code); }
};

Regex::Regex(const std::string& pattern, bool literal)
    : pattern_(pattern), compiled_(std::make_unique<Compiled>()) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  // PCRE2 takes no Unicode-property option with a literal (it needs none).
  const uint32_t options = PCRE2_UTF | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                  options, &error, &error_offset, nullptr);
  if (compiled_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw std::invalid_argument("the regular expression '" + pattern + "' does not compile (at " +
                                std::to_string(error_offset) +
                                "): " + reinterpret_cast<const char*>(message));
  }
  // The JIT is an optimisation: where the platform has none, the interpreter gives the same
  // matches.
  compiled_->jit = pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  pcre2_match_data* data = thread_match_data();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    // Text reaching here was checked to be UTF-8 once, by the tokenizer.
    const uint32_t options = PCRE2_NO_UTF_CHECK;
    const int found =
        compiled_->jit
            ? pcre2_jit_match(compiled_->code, subject, text.size(), start, options, data, nullptr)
            : pcre2_match(compiled_->code, subject, text.size(), start, options, data, nullptr);
    if (found == PCRE2_ERROR_NOMATCH) break;
    if (found < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(found, message, sizeof(message));
      throw std::runtime_error("the regular expression '" + pattern_ +
                               "' failed to match: " + reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* vector = pcre2_get_ovector_pointer(data);
    const size_t begin = vector[0], end = vector[1];
    matches.emplace_back(begin, end);
    if (end > begin) {
      start = end;
      continue;
    }
    // An empty match: step over one code point so the search moves on.
    if (end >= text.size()) break;
    start = end + 1;
    while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
      ++start;
    }
  }
  return matches;
}

std::string Regex::replace_all(std::string_view text, const std::string& replacement) const {
  std::string out;
  size_t previous = 0;
  for (const auto& [begin, end] : find_all(text)) {
    out.append(text.substr(previous, begin - previous));
    out += replacement;
    previous = end;
  }
  out.append(text.substr(previous));
  return out;
}

bool Regex::search(std::string_view text) const {
  pcre2_match_data* data = thread_match_data();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const int found = compiled_->jit ? pcre2_jit_match(compiled_->code, subject, text.size(), 0,
                                                     PCRE2_NO_UTF_CHECK, data, nullptr)
                                   : pcre2_match(compiled_->code, subject, text.size(), 0,
                                                 PCRE2_NO_UTF_CHECK, data, nullptr);
  return found >= 0;
}

Regex pattern_of(const nlohmann::json& pattern) {
  if (pattern.contains("String")) return Regex(pattern.at("String").get<std::string>(), true);
  if (pattern.contains("Regex")) return Regex(pattern.at("Regex").get<std::string>());
  throw std::invalid_argument("a pattern must be {\"String\": ...} or {\"Regex\": ...}, not " +
                              pattern.dump());
}

}  // namespace pipetrain::tokenizer
