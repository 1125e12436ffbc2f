// What pipetrain's own CUDA kernels (src/**/*.cu) share: the check after each launch, and moving
// between a tensor's element type and the fp32 that every kernel computes in.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace pipetrain::kernels {

constexpr int kWarp = 32;

// Throws, naming `kernel`, if the launch just made failed (a bad configuration, no device).
inline void check_launch(const char* kernel) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string("pipetrain: CUDA kernel ") + kernel +
                             " failed to launch: " + cudaGetErrorString(error));
  }
}

__device__ inline float to_float(float x) { return x; }
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ inline T from_float(float x);
template <>
__device__ inline float from_float<float>(float x) {
  return x;
}
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <>
__device__ inline __half from_float<__half>(float x) {
  return __float2half(x);
}

// V elements read or written in one access (16 bytes where the row allows).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// The sum of `value` over a warp's lanes, on every lane.
__device__ inline float warp_sum(float value) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

}  // namespace pipetrain::kernels
