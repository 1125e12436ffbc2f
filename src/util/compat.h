// The one place that knows the two libtorch versions pipetrain builds against: Debian's 1.13
// (CPU) and the 2.x of the GPU machines. Everything else spells c10d types and autocast's
// switches through these names. In 2.x the Gloo and NCCL process groups are c10d::Backends behind
// a dispatching ProcessGroup; pipetrain holds the backend itself, whose collectives have 1.13's
// signatures. Autocast's switches are per device type in 2.x, one function per device in 1.13.
#pragma once

#include <ATen/autocast_mode.h>
#include <c10/core/Allocator.h>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace pipetrain {

#if TORCH_VERSION_MAJOR >= 2
using ProcessGroup = c10d::Backend;
#else
using ProcessGroup = c10d::ProcessGroup;
#endif
using ProcessGroupPtr = c10::intrusive_ptr<ProcessGroup>;
using StorePtr = c10::intrusive_ptr<c10d::Store>;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

inline bool autocast_enabled(c10::DeviceType device) {
#if TORCH_VERSION_MAJOR >= 2
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::DeviceType::CUDA ? at::autocast::is_enabled()
                                         : at::autocast::is_cpu_enabled();
#endif
}

// A c10::Allocator under either version: 2.x's allocate() is not const and copy_data() is
// required. Subclasses implement allocate_bytes().
class AllocatorCompat : public c10::Allocator {
 public:
#if TORCH_VERSION_MAJOR >= 2
  c10::DataPtr allocate(size_t bytes) override { return allocate_bytes(bytes); }
  void copy_data(void* dest, const void* src, size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t bytes) const override { return allocate_bytes(bytes); }
#endif

 protected:
  virtual c10::DataPtr allocate_bytes(size_t bytes) const = 0;
};

// `t` for an ATen argument that may be absent (a Linear's or LayerNorm's missing bias).
inline c10::optional<at::Tensor> optional_tensor(const at::Tensor& t) {
  return t.defined() ? c10::optional<at::Tensor>(t) : c10::optional<at::Tensor>();
}

// The dtype autocast computes in on `device`.
inline at::ScalarType autocast_dtype(c10::DeviceType device) {
#if TORCH_VERSION_MAJOR >= 2
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                         : at::autocast::get_autocast_cpu_dtype();
#endif
}

// GEMMs of bf16 operands that write (or add into) an fp32 result: `at::mm(a, b, at::kFloat)`
// and `at::addmm_out(c, c, a, b, at::kFloat)`, on CUDA.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 10)
#define PIPETRAIN_HAS_GEMM_OUT_DTYPE 1
#else
#define PIPETRAIN_HAS_GEMM_OUT_DTYPE 0
#endif

// at::_foreach_copy_: a list of tensors copied in one kernel on CUDA (fp32 into bf16 too in recent
// 2.x; some 2.2-2.3 releases copy such pairs one by one, correctly).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
#define PIPETRAIN_HAS_FOREACH_COPY 1
#else
#define PIPETRAIN_HAS_FOREACH_COPY 0
#endif

// Turns autocast on (to bf16) or off for `device`.
inline void set_autocast_to_bf16(c10::DeviceType device, bool enabled) {
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

}  // namespace pipetrain
