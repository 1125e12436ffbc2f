#include "precision.h"

#include <ATen/autocast_mode.h>

#include <stdexcept>

namespace pipetrain {

void validate_precision(const std::string& precision) {
  if (precision != "32-true" && precision != "bf16-mixed") {
    throw std::invalid_argument("unknown precision '" + precision + "': use 32-true or bf16-mixed");
  }
}

// Autocast's switches moved between libtorch versions; the CPU ones below exist in 1.13 and
// (deprecated) in 2.x.
PrecisionGuard::PrecisionGuard(const std::string& precision) {
  if (precision != "bf16-mixed") return;
  active_ = true;
  was_enabled_ = at::autocast::is_cpu_enabled();
  at::autocast::set_cpu_enabled(true);
  at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
}

PrecisionGuard::~PrecisionGuard() {
  if (!active_) return;
  at::autocast::set_cpu_enabled(was_enabled_);
  at::autocast::clear_cache();
}

}  // namespace pipetrain
