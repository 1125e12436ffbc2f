// What a call throws, for tests that check an error's words.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

namespace pipetrain::testing {

// The text of the `Expected` exception `fn` throws. When it throws none, or another std::exception,
// a text in angle brackets that says so ("<no exception>"), which no expected words match; the
// other exception's own text goes to a test failure, not into the result, where it could hold the
// very words a test looks for.
template <typename Expected = std::exception, typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    // Tested here, not by a catch of its own: a handler of Expected before one of std::exception
    // would be dead code (and warned about) where Expected is std::exception itself.
    if (dynamic_cast<const Expected*>(&e) == nullptr) {
      ADD_FAILURE() << "expected another type of exception, got one saying: " << e.what();
      return "<not the expected type of exception>";
    }
    return e.what();
  }
  return "<no exception>";
}

}  // namespace pipetrain::testing
