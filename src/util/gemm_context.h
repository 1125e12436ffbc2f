// What each of pipetrain's own cuBLASLt GEMMs (util/cublaslt.cuh) runs with, named without
// Torch or CUDA headers: Torch's cuBLASLt handle, a workspace, and the stream.
#pragma once

#include <cstddef>

namespace pipetrain::kernels {

struct GemmContext {
  void* handle;
  void* workspace;
  size_t workspace_bytes;
  void* stream;
};

}  // namespace pipetrain::kernels
