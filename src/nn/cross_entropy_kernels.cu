// One thread block per row of logits: a pass that finds the row's softmax normaliser (its maximum
// and sum of exponentials), then, for the gradient, a pass that writes softmax - onehot. Each
// thread holds its share of the row in registers, up to kPacksPerThread 16-byte packs (a row of
// 53,248 bf16 logits at most, GPT-2's 50,304 among them), so the second pass reads nothing: the
// loss and the gradient cost one read and one write of the logits. A longer row (Llama 3's
// 128,256) goes in chunks of that size; the second pass reads again all but the last, which the
// first pass left in L2 (one block per SM: about 200 KB a row in flight per SM, within L2). An
// earlier form that read every row twice, four blocks of rows per SM, found about half of it
// evicted again: 1.65 ms on GPT-2 124M's [16384, 50304] on an H100, for a bound of about 1.0.
#include <algorithm>
#include <cstdint>

#include "cross_entropy_kernels.h"
#include "util/kernel_common.cuh"

namespace pipetrain::kernels {
namespace {

constexpr int kMaxThreads = 512;
// Packs a thread holds in registers: 52 of them for 16-byte packs, which leaves the bf16 kernel
// within 128 registers (512 threads a block) without spilling; 16 spilled.
constexpr int kPacksPerThread = 13;

// The larger of two, NaN if either is: fmaxf would drop a NaN logit and give a finite loss.
__device__ inline float max_or_nan(float a, float b) { return (a != a || a > b) ? a : b; }
// In 16 bits, exact: no conversion of each logit to fp32 only to compare it.
__device__ inline __nv_bfloat16 max_or_nan(__nv_bfloat16 a, __nv_bfloat16 b) {
  return __hmax_nan(a, b);
}
__device__ inline __half max_or_nan(__half a, __half b) { return __hmax_nan(a, b); }

// A softmax normaliser in the making: sum over the elements seen of exp(x - max).
struct Normaliser {
  float max;
  float sum;
};

__device__ inline Normaliser combine(Normaliser a, Normaliser b) {
  const float m = max_or_nan(a.max, b.max);
  if (m == -INFINITY) return {m, 0.f};  // nothing but -inf so far
  return {m, a.sum * __expf(a.max - m) + b.sum * __expf(b.max - m)};
}

__device__ Normaliser block_combine(Normaliser value, Normaliser* shared) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const Normaliser other{__shfl_xor_sync(0xffffffffu, value.max, offset),
                           __shfl_xor_sync(0xffffffffu, value.sum, offset)};
    value = combine(value, other);
  }
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < blockDim.x / kWarp ? shared[lane] : Normaliser{-INFINITY, 0.f};
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      const Normaliser other{__shfl_xor_sync(0xffffffffu, value.max, offset),
                             __shfl_xor_sync(0xffffffffu, value.sum, offset)};
      value = combine(value, other);
    }
    if (lane == 0) shared[0] = value;
  }
  __syncthreads();
  return shared[0];
}

// `grad` may be `logits` itself (chunked_cross_entropy_): every element is read before it is
// written, by the thread that writes it, the target's logit before the block's first barrier, so
// neither pointer is restrict.
template <typename T, int V>
__global__ void __launch_bounds__(kMaxThreads)
    cross_entropy_rows_kernel(const T* logits, int64_t classes, const int64_t* __restrict__ target,
                              int64_t ignore_index, bool ignore,
                              const float* __restrict__ inv_count, float* __restrict__ row_loss,
                              T* grad) {
  constexpr int P = kPacksPerThread;
  __shared__ Normaliser shared[kMaxThreads / kWarp];
  const int64_t row = blockIdx.x;
  const int64_t t = target[row];
  const bool ignored = ignore && t == ignore_index;
  const bool in_range = t >= 0 && t < classes;
  const float target_logit =
      threadIdx.x == 0 && !ignored && in_range ? to_float(logits[row * classes + t]) : 0.f;
  const auto* packs = reinterpret_cast<const Pack<T, V>*>(logits + row * classes);
  // Offsets within the row in 32 bits (a row is far below 2^31 logits): 64-bit ones, one per
  // held pack, would take the registers that hold the packs.
  const int pack_count = static_cast<int>(classes / V);
  const int chunk = static_cast<int>(blockDim.x) * P;  // packs the block holds at once
  // Pack p of a chunk starting at `first` is this thread's pack first + p * blockDim.x + thread.
  const auto index = [&](int first, int p) {
    return first + p * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x);
  };
  Pack<T, V> held[P];
  const auto load = [&](int first) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (index(first, p) < pack_count) held[p] = packs[index(first, p)];
    }
  };

  // The thread's normaliser over its packs: each chunk's maximum first, then one rescaling of
  // the sum and one exponential per logit.
  Normaliser normaliser{-INFINITY, 0.f};
  int last = 0;  // the chunk left in `held`
  for (int first = 0; first < pack_count; first += chunk) {
    last = first;
    load(first);
    T held_max = from_float<T>(-INFINITY);
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (index(first, p) >= pack_count) continue;
#pragma unroll
      for (int k = 0; k < V; ++k) held_max = max_or_nan(held_max, held[p].v[k]);
    }
    const float chunk_max = to_float(held_max);
    if (chunk_max == -INFINITY) continue;  // nothing but -inf: adds nothing
    float sum = 0.f;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (index(first, p) >= pack_count) continue;
#pragma unroll
      for (int k = 0; k < V; ++k) sum += __expf(to_float(held[p].v[k]) - chunk_max);
    }
    normaliser = combine(normaliser, {chunk_max, sum});
  }
  normaliser = block_combine(normaliser, shared);
  const float log_sum = normaliser.max + logf(normaliser.sum);
  if (threadIdx.x == 0) row_loss[row] = ignored ? 0.f : in_range ? log_sum - target_logit : NAN;
  if (grad == nullptr) return;

  // The last chunk first, from registers; any before it read again, last to first.
  const float scale = ignored ? 0.f : in_range ? inv_count[0] : NAN;
  auto* grad_packs = reinterpret_cast<Pack<T, V>*>(grad + row * classes);
  for (int first = last; first >= 0; first -= chunk) {
    if (first != last) load(first);
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int i = index(first, p);
      if (i >= pack_count) continue;
      Pack<T, V> out;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float q = __expf(to_float(held[p].v[k]) - log_sum);
        // q - 1 at the target in fp32, so that a q near 1 keeps its difference.
        out.v[k] = from_float<T>((i * V + k == t ? q - 1.f : q) * scale);
      }
      grad_packs[i] = out;
    }
  }
}

template <typename T, int V>
__global__ void scale_kernel(T* __restrict__ data, int64_t n, const float* __restrict__ factor) {
  const float f = factor[0];
  if (f == 1.f) return;
  auto* packs = reinterpret_cast<Pack<T, V>*>(data);
  const int64_t pack_count = n / V;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < pack_count; i += stride) {
    Pack<T, V> pack = packs[i];
#pragma unroll
    for (int k = 0; k < V; ++k) pack.v[k] = from_float<T>(to_float(pack.v[k]) * f);
    packs[i] = pack;
  }
  for (int64_t i = pack_count * V + first; i < n; i += stride) {
    data[i] = from_float<T>(to_float(data[i]) * f);
  }
}

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T>
void launch_rows(const void* logits, int64_t rows, int64_t classes, const int64_t* target,
                 int64_t ignore_index, bool ignore, const float* inv_count, float* row_loss,
                 void* grad, cudaStream_t stream) {
  constexpr int kVector = 16 / sizeof(T);
  const bool vectorised =
      classes % kVector == 0 && aligned(logits) && (grad == nullptr || aligned(grad));
  const int64_t packs = vectorised ? classes / kVector : classes;
  // Threads enough to hold the row (whole warps, as block_combine needs), at most kMaxThreads.
  const int64_t warps = (packs + kPacksPerThread * kWarp - 1) / (kPacksPerThread * kWarp);
  const int threads = static_cast<int>(std::min<int64_t>(kMaxThreads, warps * kWarp));
  const auto* in = static_cast<const T*>(logits);
  auto* out = static_cast<T*>(grad);
  if (vectorised) {
    cross_entropy_rows_kernel<T, kVector><<<rows, threads, 0, stream>>>(
        in, classes, target, ignore_index, ignore, inv_count, row_loss, out);
  } else {
    cross_entropy_rows_kernel<T, 1><<<rows, threads, 0, stream>>>(in, classes, target, ignore_index,
                                                                  ignore, inv_count, row_loss, out);
  }
  check_launch("cross_entropy_rows");
}

template <typename T>
void launch_scale(void* data, int64_t n, const float* factor, cudaStream_t stream) {
  constexpr int kVector = 16 / sizeof(T);
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>(4096, std::max<int64_t>(1, n / kVector / kThreads));
  if (aligned(data)) {
    scale_kernel<T, kVector><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(data), n, factor);
  } else {
    scale_kernel<T, 1><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(data), n, factor);
  }
  check_launch("scale_by");
}

}  // namespace

void cross_entropy_rows(Dtype dtype, const void* logits, int64_t rows, int64_t classes,
                        const int64_t* target, int64_t ignore_index, bool ignore,
                        const float* inv_count, float* row_loss, void* grad, void* stream) {
  if (rows == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case Dtype::kFloat:
      return launch_rows<float>(logits, rows, classes, target, ignore_index, ignore, inv_count,
                                row_loss, grad, s);
    case Dtype::kBFloat16:
      return launch_rows<__nv_bfloat16>(logits, rows, classes, target, ignore_index, ignore,
                                        inv_count, row_loss, grad, s);
    case Dtype::kHalf:
      return launch_rows<__half>(logits, rows, classes, target, ignore_index, ignore, inv_count,
                                 row_loss, grad, s);
  }
}

void scale_by(Dtype dtype, void* data, int64_t n, const float* factor, void* stream) {
  if (n == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case Dtype::kFloat:
      return launch_scale<float>(data, n, factor, s);
    case Dtype::kBFloat16:
      return launch_scale<__nv_bfloat16>(data, n, factor, s);
    case Dtype::kHalf:
      return launch_scale<__half>(data, n, factor, s);
  }
}

}  // namespace pipetrain::kernels
