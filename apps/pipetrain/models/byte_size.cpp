#include "models/byte_size.h"

#include <cctype>
#include <cmath>
#include <map>
#include <stdexcept>

namespace pipetrain::cli {

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

}  // namespace pipetrain::cli
