// One thread block per row of logits: a pass that keeps a running maximum and sum of exponentials
// (the online softmax normaliser), then, for the gradient, a pass that writes softmax - onehot,
// where log_softmax, exp and their fp32 copies cost several passes. A row of GPT-2's 50,304 bf16
// logits is 100 KB, so the second pass finds part of what the first read in L2, not all: 1.65 ms
// on GPT-2 124M's [16384, 50304] on an H100, where one read and one write take about 1.0. Holding
// each thread's share of the row in registers between the passes, which reads nothing twice, was
// slower there (1.78 ms): at 128 registers a thread one block of 16 warps fills an SM, too few
// reads in flight to hide their latency.
#include <algorithm>
#include <cstdint>

#include "cross_entropy_kernels.h"
#include "util/kernel_common.cuh"

namespace pipetrain::kernels {
namespace {

constexpr int kMaxThreads = 512;

// The larger of two, NaN if either is: fmaxf would drop a NaN logit and give a finite loss.
__device__ inline float max_or_nan(float a, float b) { return (a != a || a > b) ? a : b; }

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
// written, the target's logit before the block's first barrier, so neither pointer is restrict.
template <typename T, int V>
__global__ void cross_entropy_rows_kernel(const T* logits, int64_t classes,
                                          const int64_t* __restrict__ target, int64_t ignore_index,
                                          bool ignore, const float* __restrict__ inv_count,
                                          float* __restrict__ row_loss, T* grad) {
  __shared__ Normaliser shared[kMaxThreads / kWarp];
  const int64_t row = blockIdx.x;
  const int64_t t = target[row];
  const bool ignored = ignore && t == ignore_index;
  const bool in_range = t >= 0 && t < classes;
  const float target_logit =
      threadIdx.x == 0 && !ignored && in_range ? to_float(logits[row * classes + t]) : 0.f;
  const auto* packs = reinterpret_cast<const Pack<T, V>*>(logits + row * classes);
  const int64_t pack_count = classes / V;

  Normaliser normaliser{-INFINITY, 0.f};
  for (int64_t i = threadIdx.x; i < pack_count; i += blockDim.x) {
    const Pack<T, V> pack = packs[i];
    float x[V];
    float pack_max = -INFINITY;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      x[k] = to_float(pack.v[k]);
      pack_max = max_or_nan(pack_max, x[k]);
    }
    if (pack_max == -INFINITY) continue;
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < V; ++k) sum += __expf(x[k] - pack_max);
    normaliser = combine(normaliser, {pack_max, sum});
  }
  normaliser = block_combine(normaliser, shared);
  const float log_sum = normaliser.max + logf(normaliser.sum);
  if (threadIdx.x == 0) row_loss[row] = ignored ? 0.f : in_range ? log_sum - target_logit : NAN;
  if (grad == nullptr) return;
  const float scale = ignored ? 0.f : in_range ? inv_count[0] : NAN;
  auto* grad_packs = reinterpret_cast<Pack<T, V>*>(grad + row * classes);
  for (int64_t i = threadIdx.x; i < pack_count; i += blockDim.x) {
    const Pack<T, V> pack = packs[i];
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float p = __expf(to_float(pack.v[k]) - log_sum);
      // p - 1 at the target in fp32, so that a p near 1 keeps its difference.
      out.v[k] = from_float<T>((i * V + k == t ? p - 1.f : p) * scale);
    }
    grad_packs[i] = out;
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
  // Enough threads for a few packs each; whole warps, as block_combine needs.
  const int threads = static_cast<int>(
      std::min<int64_t>(kMaxThreads, std::max<int64_t>(kWarp, (packs + 3) / 4 / kWarp * kWarp)));
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
