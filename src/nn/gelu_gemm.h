// GPT-2's MLP GEMMs with the tanh GELU inside them, through cuBLASLt's epilogues (gelu_gemm.cu,
// built with the other kernels: PIPETRAIN_HAS_CUDA_KERNELS), as llm.c runs them on Hopper: the
// forward GEMM writes gelu(x W^T + b) and x W^T + b together, and the backward GEMM that makes
// the GELU output's gradient multiplies it by gelu'(x W^T + b) before writing it. Neither pass
// over the [rows, hidden] activations that a GELU kernel of its own would make is left.
// Raw device pointers on the caller's stream, row-major as Torch lays out a Linear's tensors, so
// that neither file needs Torch headers.
#pragma once

#include <cstdint>

#include "util/gemm_context.h"
#include "util/kernel_dtype.h"

namespace pipetrain::kernels {

// output = gelu_tanh(pre), pre = x weight^T + bias: x [rows, in], weight [out, in] (a Linear's),
// bias [out] or null, output and pre [rows, out], all of `dtype`. False, writing nothing, where
// cuBLASLt has no algorithm for it or no cuBLASLt of the headers' major version is loaded (the
// caller then computes it otherwise).
bool linear_gelu(Dtype dtype, const GemmContext& context, const void* x, const void* weight,
                 const void* bias, int64_t rows, int64_t in, int64_t out, void* output, void* pre);

// grad_pre = (grad weight) * gelu_tanh'(pre): grad [rows, out] (the gradient of the Linear that
// reads the GELU's output), weight [out, hidden] (that Linear's), pre and grad_pre [rows, hidden].
// False, writing nothing, where linear_gelu would be.
bool gelu_input_gradient(Dtype dtype, const GemmContext& context, const void* grad,
                         const void* weight, const void* pre, int64_t rows, int64_t out,
                         int64_t hidden, void* grad_pre);

}  // namespace pipetrain::kernels
