// The CUDA kernels behind pipetrain::nn's rotary embedding on a GPU (rotary_kernels.cu, built with
// the other kernels: PIPETRAIN_HAS_CUDA_KERNELS), for q and k of [batch, heads, positions,
// head_dim] rotated by cos and sin tables of [positions, head_dim]. Raw device pointers on the
// caller's stream, so that neither file needs Torch headers.
#pragma once

#include <cstdint>

#include "util/kernel_dtype.h"

namespace pipetrain::kernels {

// One [batch, heads, positions, head_dim] tensor read and one written, each head's features
// adjacent (stride 1) and the other three dimensions at any stride, in elements (q and k as
// attention hands them over: transposed views of a projection). The forward reads x and writes
// the rotated x; the backward reads the rotated x's gradient and writes x's.
struct RotaryHeads {
  int64_t heads = 0;  // 0: no tensor
  const void* input = nullptr;
  int64_t input_strides[3] = {};  // batch, head, position
  void* output = nullptr;
  int64_t output_strides[3] = {};
};

// output = x * cos + rotate_half(x) * sin, with rotate_half(x) = cat(-x[D/2:], x[:D/2]), for
// `first` and, where second.heads > 0, `second` in the same launch (q and k). x is in `x_dtype`;
// cos and sin [positions, head_dim] contiguous in `table_dtype`, which must be x_dtype or kFloat,
// and the output is in `rotated_dtype`: table_dtype (what ATen's type promotion gives x * cos),
// or x_dtype where the tables are fp32 (the fp32 result rounded once, as casting it would round
// it); other combinations throw std::invalid_argument. Computed in fp32 and rounded once; each
// product and the sum rounded to fp32 as ATen's separate kernels round them (no fused
// multiply-add), so that an fp32 result is ATen's to the bit.
void rotary_forward(Dtype x_dtype, Dtype table_dtype, Dtype rotated_dtype, const RotaryHeads& first,
                    const RotaryHeads& second, int64_t batch, int64_t positions, int64_t head_dim,
                    const void* cos, const void* sin, void* stream);

// The input gradient of rotary_forward: grad_x = grad * cos + rotate_half^T(grad * sin), the
// gradient (`input` of each RotaryHeads) in rotated_dtype, grad_x (`output`) in x_dtype, computed
// in fp32 and rounded as the forward is.
void rotary_backward(Dtype x_dtype, Dtype table_dtype, Dtype rotated_dtype,
                     const RotaryHeads& first, const RotaryHeads& second, int64_t batch,
                     int64_t positions, int64_t head_dim, const void* cos, const void* sin,
                     void* stream);

}  // namespace pipetrain::kernels
