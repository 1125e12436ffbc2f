// What a call throws, for tests that check an error's words.
#pragma once

#include <exception>
#include <string>

namespace pipetrain::testing {

// The text of the std::exception `fn` throws, or "<no exception>".
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no exception>";
}

}  // namespace pipetrain::testing
