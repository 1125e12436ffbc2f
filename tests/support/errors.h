// What a call throws, for tests that check an error's words.
#pragma once

#include <exception>
#include <string>

namespace pipetrain::testing {

// The text of the `Expected` exception `fn` throws. When it throws none, or another std::exception,
// a text in angle brackets that says so ("<no exception>"), which no expected words match.
template <typename Expected = std::exception, typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    // Tested here, not by a catch of its own: a handler of Expected before one of std::exception
    // would be dead code (and warned about) where Expected is std::exception itself.
    if (dynamic_cast<const Expected*>(&e) == nullptr) {
      return std::string("<not the expected type of exception: ") + e.what() + ">";
    }
    return e.what();
  }
  return "<no exception>";
}

}  // namespace pipetrain::testing
