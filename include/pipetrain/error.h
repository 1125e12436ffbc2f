// Error text for people: c10::Error carries a C++ backtrace that buries the one line that matters.
#pragma once

#include <exception>
#include <string>

namespace pipetrain {

// The message of `e` without a backtrace.
std::string error_message(const std::exception& e);

}  // namespace pipetrain
