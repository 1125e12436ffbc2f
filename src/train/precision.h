// Numeric precision of the steps, by Lightning's names. "bf16-mixed" runs forward passes under
// autocast to bfloat16 while weights, gradients and optimizer state stay fp32.
#pragma once

#include <string>

namespace pipetrain {

// Throws std::invalid_argument naming `precision` and the supported values.
void validate_precision(const std::string& precision);

class PrecisionGuard {
 public:
  explicit PrecisionGuard(const std::string& precision);
  ~PrecisionGuard();
  PrecisionGuard(const PrecisionGuard&) = delete;
  PrecisionGuard& operator=(const PrecisionGuard&) = delete;

 private:
  bool active_ = false;
  bool was_enabled_ = false;
};

}  // namespace pipetrain
