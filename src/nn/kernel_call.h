// What the Torch side of pipetrain's CUDA kernels shares (included only where
// PIPETRAIN_HAS_CUDA_KERNELS): a CUDA tensor's element type as the kernels name it, and the
// stream they run on.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

#include "kernel_dtype.h"

namespace pipetrain::kernels {

// The kernels' name for an element type; none for a type they do not take.
inline std::optional<Dtype> kernel_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return Dtype::kFloat;
    case at::kBFloat16:
      return Dtype::kBFloat16;
    case at::kHalf:
      return Dtype::kHalf;
    default:
      return std::nullopt;
  }
}

// The kernels' name for `tensor`'s element type; none for a CPU tensor or a type they do not take.
inline std::optional<Dtype> kernel_dtype(const at::Tensor& tensor) {
  if (!tensor.is_cuda()) return std::nullopt;
  return kernel_dtype(tensor.scalar_type());
}

inline void* current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

}  // namespace pipetrain::kernels
