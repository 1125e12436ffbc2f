// The CUDA kernel behind pipetrain::layer_norm's weight and bias gradients
// (layer_norm_kernels.cu, built with the other kernels: PIPETRAIN_HAS_CUDA_KERNELS). Raw device
// pointers on the caller's stream, so that neither file needs Torch headers.
#pragma once

#include <cstdint>

namespace pipetrain::kernels {

// Floats of scratch layer_norm_weight_gradients needs for `rows` x `columns`.
int64_t layer_norm_scratch_floats(int64_t rows, int64_t columns);

// For a LayerNorm over the last `columns` of `rows` contiguous fp32 rows, given its forward's
// per-row mean and reciprocal standard deviation:
//   grad_weight[j] = sum_i grad_output[i, j] * (input[i, j] - mean[i]) * rstd[i]
//   grad_bias[j]   = sum_i grad_output[i, j]
// summed in a fixed order (the same result every run).
void layer_norm_weight_gradients(const float* grad_output, const float* input, const float* mean,
                                 const float* rstd, int64_t rows, int64_t columns, float* scratch,
                                 float* grad_weight, float* grad_bias, void* stream);

}  // namespace pipetrain::kernels
