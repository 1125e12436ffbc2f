// The element types pipetrain's CUDA kernels take, named without Torch headers (the kernels'
// headers and .cu files include none; the callers map at::ScalarType to these).
#pragma once

namespace pipetrain::kernels {

enum class Dtype { kFloat, kBFloat16, kHalf };

}  // namespace pipetrain::kernels
