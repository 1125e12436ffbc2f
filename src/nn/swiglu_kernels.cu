// SwiGLU's elementwise step on a GPU, silu(gate) * up, one kernel each way. ATen runs it as silu
// and a product forward and, backward, a product per factor and silu's backward: five passes over
// [tokens, hidden], each writing a tensor as large, and silu(gate) saved beside gate and up for the
// backward. Llama's compiled PyTorch peer fuses them. Here the forward reads gate and up once and
// writes the product; the backward reads the gradient, gate and up once and writes both gradients,
// recomputing the sigmoid (an exp per element, hidden behind the memory traffic), so nothing but
// gate and up is saved; it can write the product again too, for the down projection's weight
// gradient, so that not even the product need be kept. Each element is computed in fp32 and rounded once to the tensors' dtype,
// with ATen's expressions, so that fp32 results are ATen's within a rounding or two.
#include <algorithm>
#include <cstdint>

#include "util/kernel_common.cuh"
#include "swiglu_kernels.h"

namespace pipetrain::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;  // beyond, threads loop over packs

__device__ inline float silu(float gate) { return gate / (1.f + expf(-gate)); }

// The forward's product, the one expression both directions round (the backward writes it again
// for the down projection's weight gradient, bit for bit what the forward wrote).
template <typename T>
__device__ inline T product(T gate, T up) {
  return from_float<T>(silu(to_float(gate)) * to_float(up));
}

struct Gradients {
  float gate, up;
};

__device__ inline Gradients swiglu_gradients(float grad, float gate, float up) {
  const float denominator = 1.f + expf(-gate);
  const float sigmoid = 1.f / denominator;
  // Rounded where ATen's separate kernels round: the product's gradient first, then silu's.
  const float grad_silu = grad * up;
  return {grad_silu * sigmoid * (1.f + gate * (1.f - sigmoid)), grad * (gate / denominator)};
}

// Packs of V elements, then the elements past the last whole pack one by one.
template <typename T, int V>
__global__ void forward_kernel(const T* __restrict__ gate, const T* __restrict__ up, int64_t n,
                               T* __restrict__ output) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / V;
  const auto* gate_packs = reinterpret_cast<const Pack<T, V>*>(gate);
  const auto* up_packs = reinterpret_cast<const Pack<T, V>*>(up);
  auto* output_packs = reinterpret_cast<Pack<T, V>*>(output);
  for (int64_t i = first; i < packs; i += stride) {
    const Pack<T, V> g = gate_packs[i], u = up_packs[i];
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = product(g.v[k], u.v[k]);
    output_packs[i] = out;
  }
  for (int64_t i = packs * V + first; i < n; i += stride) {
    output[i] = product(gate[i], up[i]);
  }
}

template <typename T, int V>
__global__ void backward_kernel(const T* __restrict__ grad, const T* __restrict__ gate,
                                const T* __restrict__ up, int64_t n, T* __restrict__ grad_gate,
                                T* __restrict__ grad_up, T* __restrict__ output) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / V;
  const auto* grad_packs = reinterpret_cast<const Pack<T, V>*>(grad);
  const auto* gate_packs = reinterpret_cast<const Pack<T, V>*>(gate);
  const auto* up_packs = reinterpret_cast<const Pack<T, V>*>(up);
  auto* grad_gate_packs = reinterpret_cast<Pack<T, V>*>(grad_gate);
  auto* grad_up_packs = reinterpret_cast<Pack<T, V>*>(grad_up);
  auto* output_packs = reinterpret_cast<Pack<T, V>*>(output);
  for (int64_t i = first; i < packs; i += stride) {
    const Pack<T, V> d = grad_packs[i], g = gate_packs[i], u = up_packs[i];
    Pack<T, V> to_gate, to_up, out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const Gradients both = swiglu_gradients(to_float(d.v[k]), to_float(g.v[k]), to_float(u.v[k]));
      to_gate.v[k] = from_float<T>(both.gate);
      to_up.v[k] = from_float<T>(both.up);
      out.v[k] = product(g.v[k], u.v[k]);
    }
    if (grad_gate_packs) grad_gate_packs[i] = to_gate;
    if (grad_up_packs) grad_up_packs[i] = to_up;
    if (output_packs) output_packs[i] = out;
  }
  for (int64_t i = packs * V + first; i < n; i += stride) {
    const Gradients both = swiglu_gradients(to_float(grad[i]), to_float(gate[i]), to_float(up[i]));
    if (grad_gate) grad_gate[i] = from_float<T>(both.gate);
    if (grad_up) grad_up[i] = from_float<T>(both.up);
    if (output) output[i] = product(gate[i], up[i]);
  }
}

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int64_t blocks_for(int64_t n, int vector) {
  return std::min(kMaxBlocks, std::max<int64_t>(1, (n / vector + kThreads - 1) / kThreads));
}

// 16 bytes at a time where every pointer allows it (null ones do), else one element at a time.
template <typename T>
void launch_forward(const void* gate, const void* up, int64_t n, void* output,
                    cudaStream_t stream) {
  constexpr int kVector = 16 / sizeof(T);
  const auto* g = static_cast<const T*>(gate);
  const auto* u = static_cast<const T*>(up);
  auto* out = static_cast<T*>(output);
  if (aligned(gate) && aligned(up) && aligned(output)) {
    forward_kernel<T, kVector><<<blocks_for(n, kVector), kThreads, 0, stream>>>(g, u, n, out);
  } else {
    forward_kernel<T, 1><<<blocks_for(n, 1), kThreads, 0, stream>>>(g, u, n, out);
  }
  check_launch("swiglu forward");
}

template <typename T>
void launch_backward(const void* grad, const void* gate, const void* up, int64_t n, void* grad_gate,
                     void* grad_up, void* output, cudaStream_t stream) {
  constexpr int kVector = 16 / sizeof(T);
  const auto* d = static_cast<const T*>(grad);
  const auto* g = static_cast<const T*>(gate);
  const auto* u = static_cast<const T*>(up);
  auto* to_gate = static_cast<T*>(grad_gate);
  auto* to_up = static_cast<T*>(grad_up);
  auto* out = static_cast<T*>(output);
  if (aligned(grad) && aligned(gate) && aligned(up) && aligned(grad_gate) && aligned(grad_up) &&
      aligned(output)) {
    backward_kernel<T, kVector>
        <<<blocks_for(n, kVector), kThreads, 0, stream>>>(d, g, u, n, to_gate, to_up, out);
  } else {
    backward_kernel<T, 1><<<blocks_for(n, 1), kThreads, 0, stream>>>(d, g, u, n, to_gate, to_up, out);
  }
  check_launch("swiglu backward");
}

}  // namespace

void swiglu_forward(Dtype dtype, const void* gate, const void* up, int64_t n, void* output,
                    void* stream) {
  if (n == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case Dtype::kFloat:
      return launch_forward<float>(gate, up, n, output, s);
    case Dtype::kBFloat16:
      return launch_forward<__nv_bfloat16>(gate, up, n, output, s);
    case Dtype::kHalf:
      return launch_forward<__half>(gate, up, n, output, s);
  }
}

void swiglu_backward(Dtype dtype, const void* grad, const void* gate, const void* up, int64_t n,
                     void* grad_gate, void* grad_up, void* output, void* stream) {
  if (n == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case Dtype::kFloat:
      return launch_backward<float>(grad, gate, up, n, grad_gate, grad_up, output, s);
    case Dtype::kBFloat16:
      return launch_backward<__nv_bfloat16>(grad, gate, up, n, grad_gate, grad_up, output, s);
    case Dtype::kHalf:
      return launch_backward<__half>(grad, gate, up, n, grad_gate, grad_up, output, s);
  }
}

}  // namespace pipetrain::kernels
