// The CUDA kernels behind chunked_cross_entropy on a GPU (cross_entropy_kernels.cu, built where
// Torch has CUDA and nvcc is found: PIPETRAIN_HAS_CUDA_KERNELS). They take raw device pointers on
// the caller's stream, so that this header and the .cu file need no Torch headers.
#pragma once

#include <cstdint>

#include "util/kernel_dtype.h"

namespace pipetrain::kernels {

// For each of `rows` rows of `classes` contiguous logits: row_loss[r] = logsumexp(row) -
// row[target[r]] in fp32, and (where `grad` is not null) the gradient of the rows' mean,
// (softmax(row) - onehot(target)) * inv_count[0], written in the logits' dtype: each row read from
// memory once where it fits in shared memory, else twice (the normaliser, then the gradient). Rows
// whose target is ignore_index (when `ignore`) get loss 0 and a zero gradient; a target out of
// range makes that row's loss and gradient NaN (a kernel cannot throw), as NaN or infinite logits
// make them NaN. `grad` may be `logits` (the gradient written over them).
void cross_entropy_rows(Dtype dtype, const void* logits, int64_t rows, int64_t classes,
                        const int64_t* target, int64_t ignore_index, bool ignore,
                        const float* inv_count, float* row_loss, void* grad, void* stream);

// data[i] *= factor[0] for `n` contiguous elements, and nothing at all (no memory touched) when
// factor[0] is exactly 1: a backward's incoming gradient, read on the device, not the host.
void scale_by(Dtype dtype, void* data, int64_t n, const float* factor, void* stream);

}  // namespace pipetrain::kernels
