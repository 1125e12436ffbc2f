#include "precision.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <stdexcept>

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
  return {convert(batch.data), convert(batch.target)};
}

namespace {

// Autocast's switches moved between libtorch versions: per device type in 2.x, one function per
// device in 1.13.
bool autocast_enabled(c10::DeviceType device) {
#if TORCH_VERSION_MAJOR >= 2
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::DeviceType::CUDA ? at::autocast::is_enabled()
                                         : at::autocast::is_cpu_enabled();
#endif
}

void set_autocast(c10::DeviceType device, bool enabled) {
#if TORCH_VERSION_MAJOR >= 2
  at::autocast::set_autocast_enabled(device, enabled);
  if (enabled) at::autocast::set_autocast_dtype(device, at::kBFloat16);
#else
  if (device == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(enabled);
    if (enabled) at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
  } else {
    at::autocast::set_cpu_enabled(enabled);
    if (enabled) at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
  }
#endif
}

}  // namespace

PrecisionGuard::PrecisionGuard(const std::string& precision, c10::DeviceType device)
    : device_(device) {
  if (precision != "bf16-mixed") return;
  active_ = true;
  was_enabled_ = autocast_enabled(device_);
  set_autocast(device_, true);
}

PrecisionGuard::~PrecisionGuard() {
  if (!active_) return;
  set_autocast(device_, was_enabled_);
  at::autocast::clear_cache();
}

}  // namespace pipetrain
