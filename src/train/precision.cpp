#include "precision.h"

#include <torch/torch.h>

#include <stdexcept>

#include "util/compat.h"

namespace pipetrain {

void validate_precision(const std::string& precision) {
  if (precision != "32-true" && precision != "bf16-mixed" && precision != "bf16-true") {
    throw std::invalid_argument("unknown precision '" + precision +
                                "': use 32-true, bf16-mixed or bf16-true");
  }
}

void convert_module(torch::nn::Sequential& layers, const std::string& precision) {
  if (precision == "bf16-true") layers->to(torch::kBFloat16);
}

Batch convert_batch(const Batch& batch, const std::string& precision) {
  if (precision != "bf16-true") return batch;
  auto convert = [](const at::Tensor& t) {
    return t.is_floating_point() ? t.to(torch::kBFloat16) : t;
  };
  return batch.map(convert);
}

PrecisionGuard::PrecisionGuard(const std::string& precision, c10::DeviceType device)
    : device_(device) {
  if (precision != "bf16-mixed") return;
  active_ = true;
  was_enabled_ = autocast_enabled(device_);
  set_autocast_to_bf16(device_, true);
}

PrecisionGuard::~PrecisionGuard() {
  if (!active_) return;
  set_autocast_to_bf16(device_, was_enabled_);
  at::autocast::clear_cache();
}

}  // namespace pipetrain
