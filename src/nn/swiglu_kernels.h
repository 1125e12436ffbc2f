// The CUDA kernels behind SwiGLU's silu(gate) * up on a GPU (swiglu_kernels.cu, built with the
// other kernels: PIPETRAIN_HAS_CUDA_KERNELS), over n contiguous elements of gate, up and their
// product, all in one dtype. Raw device pointers on the caller's stream, so that neither file needs
// Torch headers.
#pragma once

#include <cstdint>

#include "util/kernel_dtype.h"

namespace pipetrain::kernels {

// output = silu(gate) * up, silu(g) = g / (1 + exp(-g)) as ATen's kernel writes it, computed in
// fp32 and rounded once to `dtype`.
void swiglu_forward(Dtype dtype, const void* gate, const void* up, int64_t n, void* output,
                    void* stream);

// grad_gate = grad * up * silu'(gate) and grad_up = grad * silu(gate), silu'(g) = s * (1 + g *
// (1 - s)) with s = 1 / (1 + exp(-g)) (ATen's silu_backward), computed in fp32 and rounded once
// to `dtype`; and `output` = silu(gate) * up again, bit for bit swiglu_forward's. Any of the three
// outputs may be null (not written).
void swiglu_backward(Dtype dtype, const void* grad, const void* gate, const void* up, int64_t n,
                     void* grad_gate, void* grad_up, void* output, void* stream);

}  // namespace pipetrain::kernels
