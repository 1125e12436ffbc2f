// `pipetrain::layer_norm`: at::layer_norm over the last dimension, for the LayerNorms inside a
// block of one's own. Where pipetrain's CUDA kernels are built, on fp32 (as autocast runs every
// LayerNorm), the weight and bias gradients come from a kernel of pipetrain's own: ATen's sums
// each 32 columns over all the rows in one thread block, which for a transformer's [B x T, C]
// leaves most of a GPU idle (GPT-2 124M at B = 16 on an H200: 79 us a LayerNorm, 5% of a step).
// The values are ATen's; the sums' order differs (relative differences of about 1e-6).
#pragma once

#include <ATen/core/Tensor.h>

namespace pipetrain {

at::Tensor layer_norm(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                      double eps = 1e-5);

}  // namespace pipetrain
