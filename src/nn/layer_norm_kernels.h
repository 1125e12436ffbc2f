// The CUDA kernels behind pipetrain::layer_norm and pipetrain::nn::rms_norm (layer_norm_kernels.cu,
// built with the other kernels: PIPETRAIN_HAS_CUDA_KERNELS), for a LayerNorm or an RMSNorm over
// the last `columns` of `rows` contiguous fp32 rows. Raw device pointers on the caller's stream,
// so that neither file needs Torch headers.
#pragma once

#include <cstdint>

#include "util/kernel_dtype.h"

namespace pipetrain::kernels {

// What a row x is normalised to:
//   kLayerNorm: (x - mean(x)) * rstd * weight + bias, rstd = 1 / sqrt(mean((x - mean(x))^2) + eps)
//   kRmsNorm:   x * rstd * weight,                    rstd = 1 / sqrt(mean(x^2) + eps)
// An RMSNorm is a LayerNorm whose mean is 0 and which has no bias: the same kernels, which then
// neither read nor write `bias`, `mean` or `grad_bias` (null).
enum class Norm { kLayerNorm, kRmsNorm };

// Whether the row kernels (forward, input gradient) take rows of `columns`: a multiple of 4, as
// they read and write 4 elements at a time.
bool norm_takes_columns(int64_t columns);

// output (`norm` of each row) written in `output_dtype`, rounded once from fp32; mean[i] and
// rstd[i] written for the backward. Where `branch` is not null, the rows normalised are those of
// sum = input + branch (fp32; branch in `branch_dtype`), written to `sum`: a residual add.
void norm_forward(Norm norm, const float* input, Dtype branch_dtype, const void* branch,
                  const float* weight, const float* bias, int64_t rows, int64_t columns, double eps,
                  float* sum, Dtype output_dtype, void* output, float* mean, float* rstd,
                  void* stream);

// The norm's gradients, each where its output is not null:
//   grad_input (fp32) = grad_sum + rstd * (g - mean_j(g) - xhat * mean_j(g * xhat)), with
//     g = grad_output * weight and xhat = (input - mean) * rstd (for kRmsNorm, mean and mean_j(g)
//     are 0); grad_sum (fp32) the gradient `input` gets from its other readers, or null for none.
//     Where grad_branch is not null, grad_input is written there too, in `branch_dtype`: the
//     gradient of norm_forward's branch (`input` is then its sum).
//   grad_weight[j] = sum_i grad_output[i, j] * xhat[i, j]
//   grad_bias[j]   = sum_i grad_output[i, j]                  (kLayerNorm only)
// grad_output in `grad_dtype`; the weight's and bias's sums in fp32 in a fixed order (the same
// result every run), in the input gradient's pass over the rows where both are asked for and a
// lane can hold its columns' sums (up to 2048 columns for kRmsNorm, 1024 for kLayerNorm), else
// in a pass of their own. `scratch` holds norm_scratch_floats floats.
void norm_gradients(Norm norm, Dtype grad_dtype, const void* grad_output, const float* input,
                    const float* mean, const float* rstd, const float* weight, int64_t rows,
                    int64_t columns, const float* grad_sum, float* grad_input, Dtype branch_dtype,
                    void* grad_branch, float* scratch, float* grad_weight, float* grad_bias,
                    void* stream);

// Floats of scratch norm_gradients needs for `rows` x `columns`.
int64_t norm_scratch_floats(Norm norm, int64_t rows, int64_t columns);

}  // namespace pipetrain::kernels
