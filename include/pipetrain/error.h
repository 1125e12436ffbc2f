// Error text for people: c10::Error carries a C++ backtrace that buries the one line that matters.
#pragma once

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <exception>
#include <string>

namespace pipetrain {

// The message of `e` without a backtrace.
std::string error_message(const std::exception& e);

// A tensor shape as errors print it: "[8, 16]".
std::string shape_text(c10::IntArrayRef sizes);

// `text` and a newline to stderr in one write: the lines of several ranks sharing a terminal
// never mix mid-line.
void print_line(const std::string& text);

}  // namespace pipetrain
