// pipetrain's own memory-bound CUDA kernels alone, without Torch: the cross-entropy rows and the
// LayerNorm/RMSNorm forward and backward at the shapes of GPT-2 124M, Llama 150M and Llama 3.2 1B,
// in milliseconds and in bytes moved per second beside a device-to-device copy (what the memory
// allows). Built from the kernels' own sources, so an older commit's kernels can be timed by
// checking out their files:
//   nvcc -std=c++17 -O3 -arch=sm_90 -Isrc bench/kernel_bench.cu -o kernel_bench && ./kernel_bench
// Each figure is the mean of 20 launches after one warm-up (CUDA events); inputs are arbitrary
// finite values (the kernels' time does not depend on them).
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "nn/cross_entropy_kernels.cu"
#include "nn/layer_norm_kernels.cu"

namespace kernel_bench {

using namespace pipetrain::kernels;

void check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    std::printf("%s: %s\n", what, cudaGetErrorString(error));
    std::exit(1);
  }
}

// Uniform values in [-scale/2, scale/2) from a hash of the index.
__global__ void fill(float* data, size_t n, float scale) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    data[i] = (static_cast<float>(h & 0xffffff) / 16777216.f - 0.5f) * scale;
  }
}

__global__ void to_bf16(const float* from, __nv_bfloat16* to, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    to[i] = __float2bfloat16(from[i]);
  }
}

__global__ void fill_targets(int64_t* target, int64_t rows, int64_t classes) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows;
       i += int64_t{gridDim.x} * blockDim.x) {
    target[i] = i * 7919 % classes;
  }
}

template <typename F>
double milliseconds(F launch) {
  constexpr int kLaunches = 20;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  launch();
  check(cudaDeviceSynchronize(), "warm-up");
  cudaEventRecord(start);
  for (int i = 0; i < kLaunches; ++i) launch();
  cudaEventRecord(stop);
  check(cudaEventSynchronize(stop), "timed launches");
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  return ms / kLaunches;
}

void report(const char* what, double ms, double bytes) {
  std::printf("%-58s %8.3f ms %6.0f GB/s\n", what, ms, bytes / ms / 1e6);
}

}  // namespace kernel_bench

int main() {
  using namespace kernel_bench;
  cudaDeviceProp device;
  check(cudaGetDeviceProperties(&device, 0), "device");
  std::printf("%s, %d SMs\n", device.name, device.multiProcessorCount);
  const size_t floats = size_t{16384} * 50304 * 2;  // the largest shape's bf16 logits, as floats
  float* f32 = nullptr;
  __nv_bfloat16* bf16 = nullptr;
  check(cudaMalloc(&f32, floats * sizeof(float)), "cudaMalloc");
  check(cudaMalloc(&bf16, floats * sizeof(__nv_bfloat16)), "cudaMalloc");
  char line[128];
  {
    const size_t n = size_t{1} << 28;  // 1 GiB of floats copied
    report("device-to-device copy, 1 GiB",
           milliseconds([&] { cudaMemcpyAsync(f32 + n, f32, n * 4, cudaMemcpyDeviceToDevice); }),
           2.0 * n * 4);
  }
  int64_t* target = nullptr;
  float *row_loss = nullptr, *inv_count = nullptr;
  check(cudaMalloc(&target, 16384 * sizeof(int64_t)), "cudaMalloc");
  check(cudaMalloc(&row_loss, 16384 * sizeof(float)), "cudaMalloc");
  check(cudaMalloc(&inv_count, sizeof(float)), "cudaMalloc");
  const float inv = 1.f / 16384;
  cudaMemcpy(inv_count, &inv, sizeof inv, cudaMemcpyHostToDevice);
  // Rows of logits: GPT-2's, Llama 150M's, and a chunk of Llama 3's (the loss takes its rows in
  // chunks).
  for (const auto& shape :
       {std::pair<int64_t, int64_t>{16384, 50304}, {16384, 32000}, {4096, 128256}}) {
    const int64_t rows = shape.first, classes = shape.second;
    const size_t n = rows * classes;
    fill<<<4096, 256>>>(f32, n, 16.f);
    to_bf16<<<4096, 256>>>(f32, bf16, n);
    fill_targets<<<64, 256>>>(target, rows, classes);
    std::snprintf(line, sizeof line, "cross-entropy bf16 [%ld, %ld], gradient in place", rows,
                  classes);
    report(line, milliseconds([&] {
             cross_entropy_rows(Dtype::kBFloat16, bf16, rows, classes, target, -100, true,
                                inv_count, row_loss, bf16, nullptr);
           }),
           2.0 * n * sizeof(__nv_bfloat16));
  }
  // Norms over 16384 rows (B16 x T1024, B8 x T2048) of 768 (GPT-2 124M, Llama 150M), 1024 (GPT-2
  // 350M, Qwen3 0.6B) and 2048 (Llama 3.2 1B) columns, as a pre-norm block calls them under bf16
  // autocast: fp32 residual stream, bf16 branch and output in the forward; bf16 incoming
  // gradient, the residual stream's fp32 gradient added, in the backward.
  for (const int64_t columns : {768, 1024, 2048}) {
    const int64_t rows = 16384;
    const size_t n = rows * columns;
    float* x = f32;
    float* grad_sum = x + n;
    float* grad_input = grad_sum + n;
    float* sum = grad_input + n;
    float* weight = sum + n;
    float* mean = weight + columns;
    float* rstd = mean + rows;
    float* grad_weight = rstd + rows;
    float* grad_bias = grad_weight + columns;
    float* scratch = grad_bias + columns;
    __nv_bfloat16* branch = bf16;
    __nv_bfloat16* output = branch + n;
    __nv_bfloat16* grad_output = output + n;
    __nv_bfloat16* grad_branch = grad_output + n;
    fill<<<4096, 256>>>(f32, 4 * n, 4.f);
    fill<<<64, 256>>>(weight, columns, 2.f);
    to_bf16<<<4096, 256>>>(f32, bf16, 4 * n);
    for (const Norm norm : {Norm::kLayerNorm, Norm::kRmsNorm}) {
      const char* name = norm == Norm::kLayerNorm ? "LayerNorm" : "RMSNorm";
      float* bias = norm == Norm::kLayerNorm ? weight : nullptr;
      std::snprintf(line, sizeof line, "%s forward, residual add [%ld, %ld]", name, rows, columns);
      report(line, milliseconds([&] {
               norm_forward(norm, x, Dtype::kBFloat16, branch, weight, bias, rows, columns, 1e-5,
                            sum, Dtype::kBFloat16, output, mean, rstd, nullptr);
             }),
             n * (4.0 + 2 + 4 + 2));
      for (const bool with_branch : {false, true}) {
        std::snprintf(line, sizeof line, "%s backward, residual%s [%ld, %ld]", name,
                      with_branch ? " and bf16 branch" : "", rows, columns);
        report(line, milliseconds([&] {
                 norm_gradients(norm, Dtype::kBFloat16, grad_output, x, mean, rstd, weight, rows,
                                columns, grad_sum, grad_input, Dtype::kBFloat16,
                                with_branch ? grad_branch : nullptr, scratch, grad_weight,
                                norm == Norm::kLayerNorm ? grad_bias : nullptr, nullptr);
               }),
               n * (2.0 + 4 + 4 + 4 + (with_branch ? 2 : 0)));
      }
    }
  }
  check(cudaDeviceSynchronize(), "the last launches");
  return 0;
}
