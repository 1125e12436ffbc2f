// Numeric precision of the steps, by Lightning's names. "bf16-mixed" runs forward passes under
// autocast to bfloat16 while weights, gradients and optimizer state stay fp32; "bf16-true" keeps
// weights and floating-point inputs in bfloat16 throughout.
#pragma once

#include <c10/core/DeviceType.h>
#include <torch/nn/modules/container/sequential.h>

#include <string>

#include "pipetrain/data.h"

namespace pipetrain {

// Throws std::invalid_argument naming `precision` and the supported values.
void validate_precision(const std::string& precision);

// The model's parameters and buffers in the precision's dtype (bf16-true only).
void convert_module(torch::nn::Sequential& layers, const std::string& precision);
// The batch's floating-point tensors in the precision's dtype (bf16-true only).
Batch convert_batch(const Batch& batch, const std::string& precision);

// Autocast on `device` while it lives (bf16-mixed only).
class PrecisionGuard {
 public:
  PrecisionGuard(const std::string& precision, c10::DeviceType device);
  ~PrecisionGuard();
  PrecisionGuard(const PrecisionGuard&) = delete;
  PrecisionGuard& operator=(const PrecisionGuard&) = delete;

 private:
  bool active_ = false;
  bool was_enabled_ = false;
  c10::DeviceType device_;
};

}  // namespace pipetrain
