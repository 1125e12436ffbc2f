// What the Torch side of pipetrain's CUDA kernels shares (included only where
// PIPETRAIN_HAS_CUDA_KERNELS): a CUDA tensor's element type as the kernels name it, the stream
// they run on, and what pipetrain's own cuBLASLt GEMMs run with.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

#include "gemm_context.h"
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

// A cuBLASLt GEMM's workspace on `like`'s device, each call's own, from the caching allocator:
// safe beside any other GEMM in flight, and while a CUDA graph is captured. Kept alive until
// the GEMM is queued.
constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;
inline at::Tensor gemm_workspace(const at::Tensor& like) {
  return at::empty({static_cast<int64_t>(kGemmWorkspaceBytes)}, like.options().dtype(at::kByte));
}

// Torch's cuBLASLt handle and the current stream (of the current device), with `workspace`.
inline GemmContext gemm_context(const at::Tensor& workspace) {
  return GemmContext{at::cuda::getCurrentCUDABlasLtHandle(), workspace.data_ptr(),
                     static_cast<size_t>(workspace.numel()), current_stream()};
}

}  // namespace pipetrain::kernels
