// One thread block per row of logits, in one of two forms:
// - Where the block's row fits in shared memory twice over an SM's (GPT-2's 50,304 bf16 logits are
//   100 KB: two rows an SM on an H100 or H200) and the gradient is wanted, the row is copied into
//   shared memory once (cp.async: no registers held while the copy is in flight), and the passes
//   that find its maximum, its sum of exponentials and the gradient softmax - onehot read it there:
//   each logit is read from memory once and its gradient written once, the least a loss can move.
//   On an H100: 1.12 ms for GPT-2 124M's [16384, 50304] and 0.71 ms for Llama 150M's
//   [16384, 32000], 2.95 TB/s where a device-to-device copy moves 3.03 (two-pass: 1.62, 0.95).
// - Otherwise a pass keeps a running maximum and sum of exponentials (the online softmax
//   normaliser), and a second pass, for the gradient, reads the row again (Llama 3's 128,256 bf16
//   logits, 250 KB a row, find part of it in L2: 2.0 TB/s on an H100). Holding each thread's share
//   of the row in registers between the passes was slower than both (1.78 ms on GPT-2's logits):
//   at 128 registers a thread one block of 16 warps fills an SM, too few reads in flight.
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

// The gradient of `pack`, the row's elements from `first` on: (softmax - onehot(t)) * scale.
template <typename T, int V>
__device__ inline Pack<T, V> gradient_pack(const Pack<T, V>& pack, int64_t first, int64_t t,
                                           float log_sum, float scale) {
  Pack<T, V> out;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float p = __expf(to_float(pack.v[k]) - log_sum);
    // p - 1 at the target in fp32, so that a p near 1 keeps its difference.
    out.v[k] = from_float<T>((first + k == t ? p - 1.f : p) * scale);
  }
  return out;
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
    grad_packs[i] = gradient_pack(packs[i], i * V, t, log_sum, scale);
  }
}

// The row in shared memory: `cross_entropy_rows_kernel`'s results, each logit read from global
// memory once. Threads of kSharedThreads, packs of 16 bytes (the row's start is 16-byte aligned and
// its length a whole number of packs); `grad` may be `logits`, as the whole row is in shared memory
// before the first gradient is written.
constexpr int kSharedThreads = 512;

template <typename T, int V>
__global__ void __launch_bounds__(kSharedThreads, 2)
    cross_entropy_shared_row_kernel(const T* logits, int64_t classes,
                                    const int64_t* __restrict__ target, int64_t ignore_index,
                                    bool ignore, const float* __restrict__ inv_count,
                                    float* __restrict__ row_loss, T* grad) {
  extern __shared__ float4 shared_row[];
  __shared__ float partial[kSharedThreads / kWarp];
  const int64_t row = blockIdx.x;
  const int pack_count = static_cast<int>(classes / V);
  const auto* packs = reinterpret_cast<const Pack<T, V>*>(logits + row * classes);
  auto* row_packs = reinterpret_cast<Pack<T, V>*>(shared_row);
  for (int i = threadIdx.x; i < pack_count; i += kSharedThreads) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const auto to = static_cast<unsigned>(__cvta_generic_to_shared(row_packs + i));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(packs + i));
#else
    row_packs[i] = packs[i];
#endif
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::);
#endif
  __syncthreads();

  // A block-wide reduction of one float per thread; `op` combines two.
  const auto reduce = [&](float value, auto op) {
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
    }
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    if (lane == 0) partial[warp] = value;
    __syncthreads();
    value = partial[0];
    for (int w = 1; w < kSharedThreads / kWarp; ++w) value = op(value, partial[w]);
    __syncthreads();  // partial is written again by the next reduction
    return value;
  };

  float max = -INFINITY;
  for (int i = threadIdx.x; i < pack_count; i += kSharedThreads) {
    const Pack<T, V> pack = row_packs[i];
#pragma unroll
    for (int k = 0; k < V; ++k) max = max_or_nan(max, to_float(pack.v[k]));
  }
  max = reduce(max, [](float a, float b) { return max_or_nan(a, b); });
  float sum = 0.f;
  if (max != -INFINITY) {  // nothing but -inf: the sum of nothing, as the online pass leaves it
    for (int i = threadIdx.x; i < pack_count; i += kSharedThreads) {
      const Pack<T, V> pack = row_packs[i];
#pragma unroll
      for (int k = 0; k < V; ++k) sum += __expf(to_float(pack.v[k]) - max);
    }
  }
  sum = reduce(sum, [](float a, float b) { return a + b; });
  const float log_sum = max + logf(sum);
  const int64_t t = target[row];
  const bool ignored = ignore && t == ignore_index;
  const bool in_range = t >= 0 && t < classes;
  if (threadIdx.x == 0) {
    const float target_logit =
        !ignored && in_range ? to_float(reinterpret_cast<const T*>(shared_row)[t]) : 0.f;
    row_loss[row] = ignored ? 0.f : in_range ? log_sum - target_logit : NAN;
  }
  const float scale = ignored ? 0.f : in_range ? inv_count[0] : NAN;
  auto* grad_packs = reinterpret_cast<Pack<T, V>*>(grad + row * classes);
  for (int i = threadIdx.x; i < pack_count; i += kSharedThreads) {
    grad_packs[i] = gradient_pack(row_packs[i], int64_t{i} * V, t, log_sum, scale);
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

// Whether a row of `bytes` fits cross_entropy_shared_row_kernel on the current device: two blocks'
// rows (and their few bytes of reductions) in one SM's shared memory, so that one block's copy in
// runs beside another's arithmetic and writes.
bool row_fits_in_shared_memory(int64_t bytes) {
  int device = 0, per_sm = 0, per_block = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    cudaGetLastError();  // clear it: the two-pass kernel needs no attribute
    return false;
  }
  constexpr int64_t kReserved = 2048;  // per block: the runtime's 1 KB and the reductions'
  return bytes <= per_block && 2 * (bytes + kReserved) <= per_sm;
}

template <typename T>
void launch_rows(const void* logits, int64_t rows, int64_t classes, const int64_t* target,
                 int64_t ignore_index, bool ignore, const float* inv_count, float* row_loss,
                 void* grad, cudaStream_t stream) {
  constexpr int kVector = 16 / sizeof(T);
  const bool vectorised =
      classes % kVector == 0 && aligned(logits) && (grad == nullptr || aligned(grad));
  const auto* in = static_cast<const T*>(logits);
  auto* out = static_cast<T*>(grad);
  const int64_t row_bytes = classes * static_cast<int64_t>(sizeof(T));
  if (grad != nullptr && vectorised && row_fits_in_shared_memory(row_bytes)) {
    const auto kernel = cross_entropy_shared_row_kernel<T, kVector>;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(row_bytes)) == cudaSuccess) {
      kernel<<<rows, kSharedThreads, row_bytes, stream>>>(in, classes, target, ignore_index, ignore,
                                                          inv_count, row_loss, out);
      check_launch("cross_entropy_shared_row");
      return;
    }
    cudaGetLastError();
  }
  const int64_t packs = vectorised ? classes / kVector : classes;
  // Enough threads for a few packs each; whole warps, as block_combine needs.
  const int threads = static_cast<int>(
      std::min<int64_t>(kMaxThreads, std::max<int64_t>(kWarp, (packs + 3) / 4 / kWarp * kWarp)));
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
