// The CUDA kernels behind pipetrain::layer_norm (layer_norm_kernels.cu, built with the other
// kernels: PIPETRAIN_HAS_CUDA_KERNELS), for a LayerNorm over the last `columns` of `rows`
// contiguous fp32 rows. Raw device pointers on the caller's stream, so that neither file needs
// Torch headers.
#pragma once

#include <cstdint>

#include "kernel_dtype.h"

namespace pipetrain::kernels {

// Whether the row kernels (forward, input gradient) take rows of `columns`: a multiple of 4, as
// they read and write 4 elements at a time.
bool layer_norm_takes_columns(int64_t columns);

// output[i, j] = (input[i, j] - mean[i]) * rstd[i] * weight[j] + bias[j], written in
// `output_dtype` (rounded once, from fp32); mean[i] and rstd[i] = 1 / sqrt(biased variance + eps)
// written for the backward.
void layer_norm_forward(const float* input, const float* weight, const float* bias, int64_t rows,
                        int64_t columns, double eps, Dtype output_dtype, void* output, float* mean,
                        float* rstd, void* stream);

// The same with a residual add first: sum = input + branch (fp32; branch in `branch_dtype`),
// written, then normalised as layer_norm_forward normalises input.
void add_layer_norm_forward(const float* input, Dtype branch_dtype, const void* branch,
                            const float* weight, const float* bias, int64_t rows, int64_t columns,
                            double eps, float* sum, Dtype output_dtype, void* output, float* mean,
                            float* rstd, void* stream);

// grad_input (fp32) = grad_sum + rstd * (g - mean_j(g) - xhat * mean_j(g * xhat)), with
// g = grad_output * weight and xhat = (input - mean) * rstd; grad_output in `grad_dtype`,
// grad_sum (fp32) the gradient `input` gets from its other readers, or null for none. Where
// grad_branch is not null, grad_input is written there too, in `branch_dtype`: the gradient of
// add_layer_norm_forward's branch (`input` is then its sum).
void layer_norm_input_gradient(Dtype grad_dtype, const void* grad_output, const float* input,
                               const float* mean, const float* rstd, const float* weight,
                               int64_t rows, int64_t columns, const float* grad_sum,
                               float* grad_input, Dtype branch_dtype, void* grad_branch,
                               void* stream);

// Floats of scratch layer_norm_weight_gradients needs for `rows` x `columns`.
int64_t layer_norm_scratch_floats(int64_t rows, int64_t columns);

//   grad_weight[j] = sum_i grad_output[i, j] * (input[i, j] - mean[i]) * rstd[i]
//   grad_bias[j]   = sum_i grad_output[i, j]
// in fp32, grad_output in `grad_dtype`, summed in a fixed order (the same result every run).
void layer_norm_weight_gradients(Dtype grad_dtype, const void* grad_output, const float* input,
                                 const float* mean, const float* rstd, int64_t rows,
                                 int64_t columns, float* scratch, float* grad_weight,
                                 float* grad_bias, void* stream);

}  // namespace pipetrain::kernels
