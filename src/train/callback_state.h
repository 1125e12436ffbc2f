// Callback state travels in checkpoint files as strings. These write numbers so they read back
// exactly, and read them back naming the callback and key when a value is damaged.
#pragma once

#include <cstdint>
#include <string>

namespace pipetrain {

// "%.17g": round-trips through strtod.
std::string format_exact(double value);
// Throw std::invalid_argument naming `owner` ("EarlyStopping") and `key` when `text` is not one.
double parse_state_double(const std::string& owner, const std::string& key,
                          const std::string& text);
int64_t parse_state_int(const std::string& owner, const std::string& key, const std::string& text);

}  // namespace pipetrain
