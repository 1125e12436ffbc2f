// What pipetrain's own CUDA kernels (src/**/*.cu) share: the check after each launch.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace pipetrain::kernels {

// Throws, naming `kernel`, if the launch just made failed (a bad configuration, no device).
inline void check_launch(const char* kernel) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string("pipetrain: CUDA kernel ") + kernel +
                             " failed to launch: " + cudaGetErrorString(error));
  }
}

}  // namespace pipetrain::kernels
