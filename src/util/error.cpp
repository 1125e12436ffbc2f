#include "pipetrain/error.h"

#include <c10/util/Exception.h>

#include <sstream>

namespace pipetrain {

std::string error_message(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

std::string shape_text(c10::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

}  // namespace pipetrain
