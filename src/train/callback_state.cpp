#include "callback_state.h"

#include <cstdio>
#include <stdexcept>

namespace pipetrain {
namespace {

[[noreturn]] void damaged(const std::string& owner, const std::string& key, const std::string& text,
                          const char* expected) {
  throw std::invalid_argument(owner + " state '" + key + "' is not " + expected + ": '" + text +
                              "'; the checkpoint file is damaged or was not written by pipetrain");
}

}  // namespace

std::string format_exact(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.17g", value);
  return buffer;
}

double parse_state_double(const std::string& owner, const std::string& key,
                          const std::string& text) {
  try {
    size_t used = 0;
    const double value = std::stod(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
    // Reported below with the key.
  }
  damaged(owner, key, text, "a number");
}

int64_t parse_state_int(const std::string& owner, const std::string& key, const std::string& text) {
  try {
    size_t used = 0;
    const long long value = std::stoll(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
    // Reported below with the key.
  }
  damaged(owner, key, text, "an integer");
}

}  // namespace pipetrain
