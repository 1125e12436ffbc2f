// A Linear's weight and bias gradients in one GEMM on a GPU (weight_gradient_gemm.cu, built with
// the other kernels: PIPETRAIN_HAS_CUDA_KERNELS): cuBLASLt's BGRADB epilogue sums the output
// gradient's columns as the weight's GEMM reads them, where a GEMM of its own for the bias (a
// column sum as a product with a row of ones) read the whole output gradient again: about 1 ms of
// a GPT-2 124M step (B16 T1024) on an H100. Raw device pointers on the caller's stream, row-major
// as Torch lays them out, so that neither file needs Torch headers.
#pragma once

#include <cstdint>

#include "util/gemm_context.h"
#include "util/kernel_dtype.h"

namespace pipetrain::kernels {

// grad_weight (+)= grad^T x and grad_bias = the sums of grad's columns, both fp32: grad [rows,
// out] and x [rows, in] of `dtype` (16-bit), grad_weight [out, in] added into where `accumulate`,
// else written; grad_bias [out] always written. False, writing nothing, where cuBLASLt has no
// algorithm for it or no cuBLASLt of the headers' major version is loaded (the caller then
// computes them otherwise).
bool weight_and_bias_gradients(Dtype dtype, const GemmContext& context, const void* grad,
                               const void* x, int64_t rows, int64_t in, int64_t out,
                               bool accumulate, float* grad_weight, float* grad_bias);

}  // namespace pipetrain::kernels
