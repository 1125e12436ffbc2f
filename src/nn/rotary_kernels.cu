// Rotary embeddings on a GPU, one kernel each way for q and k together. ATen's expression,
// x * cos + cat(-x[D/2:], x[:D/2]) * sin, is a negation, a concatenation, two products and a sum,
// each a pass over the whole tensor that writes another, for q and for k (and as many again
// backward); Llama's compiled PyTorch peer fuses them. Here each thread takes V features of the
// first half of one head at one position and the V features they pair with in the second half:
// it reads each element of x once and writes each of the output once, in the output's dtype (fp32
// where autocast's tables are fp32 and q is bf16, as ATen's promotion gives, or x's own where
// attention would cast it back at once). The tables' rows are
// read by every head of every sequence and stay in cache. The backward is the same pass with the
// rotation transposed: grad_x = grad * cos + rotate_half^T(grad * sin).
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "util/kernel_common.cuh"
#include "rotary_kernels.h"

namespace pipetrain::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // beyond, threads loop over items

// Item `item` of `tensor`: V features of the first half of one head at one position and the V
// features of the second half they pair with. The forward reads X and writes R (the rotated x's
// dtype); the backward reads R (the rotated x's gradient) and writes X.
template <typename X, typename Table, typename R, int V, bool kBackward>
__device__ inline void rotate_item(const RotaryHeads& tensor, int64_t item, int64_t packs,
                                   int64_t positions, int64_t half, const Table* __restrict__ cos,
                                   const Table* __restrict__ sin) {
  using Read = std::conditional_t<kBackward, R, X>;
  using Written = std::conditional_t<kBackward, X, R>;
  const int64_t feature = item % packs * V;
  item /= packs;
  const int64_t head = item % tensor.heads;
  item /= tensor.heads;
  const int64_t position = item % positions;
  const int64_t sequence = item / positions;
  const Read* in = static_cast<const Read*>(tensor.input) + sequence * tensor.input_strides[0] +
                   head * tensor.input_strides[1] + position * tensor.input_strides[2] + feature;
  Written* out = static_cast<Written*>(tensor.output) + sequence * tensor.output_strides[0] +
                 head * tensor.output_strides[1] + position * tensor.output_strides[2] + feature;
  const int64_t row = position * 2 * half + feature;
  const auto lo = *reinterpret_cast<const Pack<Read, V>*>(in);
  const auto hi = *reinterpret_cast<const Pack<Read, V>*>(in + half);
  const auto cos_lo = *reinterpret_cast<const Pack<Table, V>*>(cos + row);
  const auto cos_hi = *reinterpret_cast<const Pack<Table, V>*>(cos + row + half);
  const auto sin_lo = *reinterpret_cast<const Pack<Table, V>*>(sin + row);
  const auto sin_hi = *reinterpret_cast<const Pack<Table, V>*>(sin + row + half);
  Pack<Written, V> out_lo, out_hi;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float a = to_float(lo.v[k]), b = to_float(hi.v[k]);
    const float c_lo = to_float(cos_lo.v[k]), c_hi = to_float(cos_hi.v[k]);
    const float s_lo = to_float(sin_lo.v[k]), s_hi = to_float(sin_hi.v[k]);
    // Each product rounded before the sum, as ATen's kernels write them (nvcc would otherwise
    // fuse one product into the sum).
    if constexpr (kBackward) {
      out_lo.v[k] = from_float<Written>(__fadd_rn(__fmul_rn(a, c_lo), __fmul_rn(b, s_hi)));
      out_hi.v[k] = from_float<Written>(__fsub_rn(__fmul_rn(b, c_hi), __fmul_rn(a, s_lo)));
    } else {
      out_lo.v[k] = from_float<Written>(__fsub_rn(__fmul_rn(a, c_lo), __fmul_rn(b, s_lo)));
      out_hi.v[k] = from_float<Written>(__fadd_rn(__fmul_rn(b, c_hi), __fmul_rn(a, s_hi)));
    }
  }
  *reinterpret_cast<Pack<Written, V>*>(out) = out_lo;
  *reinterpret_cast<Pack<Written, V>*>(out + half) = out_hi;
}

// The items of `first` and then those of `second`: the V features of the first half fastest, then
// heads, which attention's layout (a projection's [B, T, H, D] transposed) puts side by side and
// which read the same row of the tables, then positions, then sequences.
template <typename X, typename Table, typename R, int V, bool kBackward>
__global__ void rotary_kernel(const RotaryHeads first, const RotaryHeads second, int64_t batch,
                              int64_t positions, int64_t half, const Table* __restrict__ cos,
                              const Table* __restrict__ sin) {
  const int64_t packs = half / V;
  const int64_t first_items = batch * first.heads * positions * packs;
  const int64_t items = first_items + batch * second.heads * positions * packs;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; item < items;
       item += stride) {
    // Two calls rather than a reference chosen at run time, which would copy both tensors'
    // parameters to local memory.
    if (item < first_items) {
      rotate_item<X, Table, R, V, kBackward>(first, item, packs, positions, half, cos, sin);
    } else {
      rotate_item<X, Table, R, V, kBackward>(second, item - first_items, packs, positions, half,
                                             cos, sin);
    }
  }
}

bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Whether `tensor` can be read and written V elements at a time.
template <typename Read, typename Written, int V>
bool takes_packs(const RotaryHeads& tensor) {
  if (tensor.heads == 0) return true;
  for (int d = 0; d < 3; ++d) {
    if (tensor.input_strides[d] % V != 0 || tensor.output_strides[d] % V != 0) return false;
  }
  return aligned_to(tensor.input, V * sizeof(Read)) &&
         aligned_to(tensor.output, V * sizeof(Written));
}

template <typename X, typename Table, typename R, bool kBackward, int V>
void launch_packs(const RotaryHeads& first, const RotaryHeads& second, int64_t batch,
                  int64_t positions, int64_t half, const Table* cos, const Table* sin,
                  cudaStream_t stream) {
  const int64_t items = batch * (first.heads + second.heads) * positions * (half / V);
  if (items == 0) return;
  const int64_t blocks = std::min(kMaxBlocks, (items + kThreads - 1) / kThreads);
  rotary_kernel<X, Table, R, V, kBackward><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      first, second, batch, positions, half, cos, sin);
  check_launch(kBackward ? "rotary backward" : "rotary forward");
}

// 16 bytes of x at a time (8 bf16 or 4 fp32 features) where every tensor's rows and the half
// allow it, else one feature at a time.
template <typename X, typename Table, typename R, bool kBackward>
void launch(const RotaryHeads& first, const RotaryHeads& second, int64_t batch, int64_t positions,
            int64_t head_dim, const void* cos, const void* sin, cudaStream_t stream) {
  using Read = std::conditional_t<kBackward, R, X>;
  using Written = std::conditional_t<kBackward, X, R>;
  constexpr int kVector = 16 / sizeof(X);
  const int64_t half = head_dim / 2;
  const auto* cos_table = static_cast<const Table*>(cos);
  const auto* sin_table = static_cast<const Table*>(sin);
  const bool packed = half % kVector == 0 && aligned_to(cos, kVector * sizeof(Table)) &&
                      aligned_to(sin, kVector * sizeof(Table)) &&
                      takes_packs<Read, Written, kVector>(first) &&
                      takes_packs<Read, Written, kVector>(second);
  if (packed) {
    launch_packs<X, Table, R, kBackward, kVector>(first, second, batch, positions, half, cos_table,
                                                  sin_table, stream);
  } else {
    launch_packs<X, Table, R, kBackward, 1>(first, second, batch, positions, half, cos_table,
                                            sin_table, stream);
  }
}

template <typename X, bool kBackward>
void with_table_type(Dtype x_dtype, Dtype table_dtype, Dtype rotated_dtype,
                     const RotaryHeads& first, const RotaryHeads& second, int64_t batch,
                     int64_t positions, int64_t head_dim, const void* cos, const void* sin,
                     cudaStream_t stream) {
  if (table_dtype == x_dtype && rotated_dtype == x_dtype) {
    return launch<X, X, X, kBackward>(first, second, batch, positions, head_dim, cos, sin, stream);
  }
  if (table_dtype == Dtype::kFloat && rotated_dtype == Dtype::kFloat) {
    return launch<X, float, float, kBackward>(first, second, batch, positions, head_dim, cos, sin,
                                              stream);
  }
  if (table_dtype == Dtype::kFloat && rotated_dtype == x_dtype) {
    return launch<X, float, X, kBackward>(first, second, batch, positions, head_dim, cos, sin,
                                          stream);
  }
  throw std::invalid_argument(
      "pipetrain: rotary kernels take tables in x's dtype or fp32, and rotate into the tables' "
      "dtype or x's");
}

template <bool kBackward>
void rotary(Dtype x_dtype, Dtype table_dtype, Dtype rotated_dtype, const RotaryHeads& first,
            const RotaryHeads& second, int64_t batch, int64_t positions, int64_t head_dim,
            const void* cos, const void* sin, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (x_dtype) {
    case Dtype::kFloat:
      return with_table_type<float, kBackward>(x_dtype, table_dtype, rotated_dtype, first, second,
                                               batch, positions, head_dim, cos, sin, s);
    case Dtype::kBFloat16:
      return with_table_type<__nv_bfloat16, kBackward>(x_dtype, table_dtype, rotated_dtype, first,
                                                       second, batch, positions, head_dim, cos, sin,
                                                       s);
    case Dtype::kHalf:
      return with_table_type<__half, kBackward>(x_dtype, table_dtype, rotated_dtype, first, second,
                                                batch, positions, head_dim, cos, sin, s);
  }
}

}  // namespace

void rotary_forward(Dtype x_dtype, Dtype table_dtype, Dtype rotated_dtype, const RotaryHeads& first,
                    const RotaryHeads& second, int64_t batch, int64_t positions, int64_t head_dim,
                    const void* cos, const void* sin, void* stream) {
  rotary<false>(x_dtype, table_dtype, rotated_dtype, first, second, batch, positions, head_dim, cos,
                sin, stream);
}

void rotary_backward(Dtype x_dtype, Dtype table_dtype, Dtype rotated_dtype,
                     const RotaryHeads& first, const RotaryHeads& second, int64_t batch,
                     int64_t positions, int64_t head_dim, const void* cos, const void* sin,
                     void* stream) {
  rotary<true>(x_dtype, table_dtype, rotated_dtype, first, second, batch, positions, head_dim, cos,
               sin, stream);
}

}  // namespace pipetrain::kernels
