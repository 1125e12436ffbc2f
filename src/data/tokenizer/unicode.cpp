#include "data/tokenizer/unicode.h"

#include <stdexcept>

#if __has_include(<utf8proc.h>)
#define PIPETRAIN_HAS_UTF8PROC
#include <utf8proc.h>

#include <cstdlib>
#endif

namespace pipetrain::tokenizer {

bool is_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

#ifdef PIPETRAIN_HAS_UTF8PROC

bool is_nonspacing_mark(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_MN;
}

char32_t simple_lowercase(char32_t c) {
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}

std::string normalized(std::string_view text, NormalForm form) {
  if (text.empty()) return "";
  int options = UTF8PROC_STABLE;
  options |=
      form == NormalForm::kNfc || form == NormalForm::kNfkc ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
  if (form == NormalForm::kNfkc || form == NormalForm::kNfkd) options |= UTF8PROC_COMPAT;
  utf8proc_uint8_t* mapped = nullptr;
  const auto length = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                   static_cast<utf8proc_ssize_t>(text.size()), &mapped,
                                   static_cast<utf8proc_option_t>(options));
  if (length < 0) {
    throw std::runtime_error(std::string("Unicode normalization failed: ") +
                             utf8proc_errmsg(length));
  }
  std::string out(reinterpret_cast<const char*>(mapped), static_cast<size_t>(length));
  std::free(mapped);
  return out;
}

#else

namespace {
[[noreturn]] void missing_utf8proc(const std::string& component) {
  throw std::invalid_argument(
      component + " needs Unicode data from utf8proc, which this build of pipetrain lacks: " +
      "install libutf8proc-dev (Debian) and rebuild pipetrain");
}
}  // namespace

bool is_nonspacing_mark(char32_t) { missing_utf8proc("StripAccents"); }
char32_t simple_lowercase(char32_t) { missing_utf8proc("Lowercase"); }
std::string normalized(std::string_view, NormalForm) { missing_utf8proc("a normal form"); }

#endif

void require_unicode_data([[maybe_unused]] const std::string& component) {
#ifndef PIPETRAIN_HAS_UTF8PROC
  missing_utf8proc(component);
#endif
}

bool built_with_unicode_libraries() {
#if defined(PIPETRAIN_HAS_UTF8PROC) && __has_include(<pcre2.h>)
  return true;
#else
  return false;
#endif
}

}  // namespace pipetrain::tokenizer
