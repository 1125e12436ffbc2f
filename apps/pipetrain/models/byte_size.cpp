#include "models/byte_size.h"

#include <cctype>
#include <cmath>
#include <map>
#include <optional>
#include <stdexcept>

namespace pipetrain::cli {
namespace {

// The bytes `text` says, rounded down (infinite where it says so); std::nullopt where it is not a
// size.
std::optional<double> byte_count(const std::string& text) {
  size_t end = 0;
  double number = 0;
  try {
    number = std::stod(text, &end);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  std::string unit;
  for (const char c : text.substr(end)) {
    if (c != ' ') unit += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  static const std::map<std::string, double> kUnits{{"", 1},
                                                    {"b", 1},
                                                    {"kib", 1024.0},
                                                    {"mib", 1048576.0},
                                                    {"gib", 1073741824.0},
                                                    {"tib", 1099511627776.0},
                                                    {"kb", 1e3},
                                                    {"mb", 1e6},
                                                    {"gb", 1e9},
                                                    {"tb", 1e12}};
  const auto scale = kUnits.find(unit);
  if (scale == kUnits.end() || !(number >= 0)) return std::nullopt;
  return std::floor(number * scale->second);
}

}  // namespace

int64_t parse_byte_size(const std::string& flag, const std::string& text, int64_t minimum) {
  const auto bytes = byte_count(text);
  if (!bytes || *bytes < static_cast<double>(minimum)) {
    throw std::invalid_argument(
        flag + " " + text + ": give a number of bytes" +
        (minimum > 0 ? " (at least " + std::to_string(minimum) + ")" : std::string()) +
        ", optionally with a unit: KiB, MiB, GiB, TiB (1024s) or KB, MB, GB, TB (1000s), e.g. "
        "40GiB or 5GB");
  }
  // Past 2^63 a count of bytes does not fit (and inf would be taken as no limit).
  if (!(*bytes < 9223372036854775808.0)) {
    throw std::invalid_argument(flag + " " + text +
                                " is more bytes than any machine holds (at most 8 EiB, 2^63 - 1)");
  }
  return static_cast<int64_t>(*bytes);
}

}  // namespace pipetrain::cli
