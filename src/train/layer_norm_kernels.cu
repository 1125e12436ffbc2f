// A LayerNorm's weight and bias gradients are sums over rows, column by column. ATen's kernel
// gives each 32 columns one thread block over all the rows: for GPT-2's [16384, 768] that is 24
// blocks on an H200's 132 SMs, 79 us where the reads allow about 25. Here each block sums 32
// columns over kRowsPerBlock rows (a warp reads 32 adjacent floats of a row at a time), writes
// its partial sums, and a second kernel adds the partial sums of each column in a fixed order.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernel_launch.cuh"
#include "layer_norm_kernels.h"

namespace pipetrain::kernels {
namespace {

constexpr int kColumns = 32;    // per block: one warp's width
constexpr int kRowThreads = 8;  // warps per block, each taking every 8th row
constexpr int kRowsPerBlock = 256;

int64_t row_blocks(int64_t rows) { return (rows + kRowsPerBlock - 1) / kRowsPerBlock; }

__global__ void partial_sums_kernel(const float* __restrict__ grad_output,
                                    const float* __restrict__ input, const float* __restrict__ mean,
                                    const float* __restrict__ rstd, int64_t rows, int64_t columns,
                                    float* __restrict__ partial_weight,
                                    float* __restrict__ partial_bias) {
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kColumns + threadIdx.x;
  __shared__ float weights[kRowThreads][kColumns + 1], biases[kRowThreads][kColumns + 1];
  // Row block by row block (the grid's y is at most 65535 blocks).
  for (int64_t block = blockIdx.y; block * kRowsPerBlock < rows; block += gridDim.y) {
    const int64_t first = block * kRowsPerBlock;
    const int64_t end = first + kRowsPerBlock < rows ? first + kRowsPerBlock : rows;
    float weight = 0.f, bias = 0.f;
    if (column < columns) {
      for (int64_t row = first + threadIdx.y; row < end; row += kRowThreads) {
        const int64_t at = row * columns + column;
        const float g = grad_output[at];
        weight += g * (input[at] - mean[row]) * rstd[row];
        bias += g;
      }
    }
    weights[threadIdx.y][threadIdx.x] = weight;
    biases[threadIdx.y][threadIdx.x] = bias;
    __syncthreads();
    if (threadIdx.y == 0 && column < columns) {
      for (int i = 1; i < kRowThreads; ++i) {
        weight += weights[i][threadIdx.x];
        bias += biases[i][threadIdx.x];
      }
      partial_weight[block * columns + column] = weight;
      partial_bias[block * columns + column] = bias;
    }
    __syncthreads();  // before the next row block overwrites the shared sums
  }
}

// The partial sums of each column added in a fixed order: thread (x, y) takes every
// kRowThreads-th row block from y, and the kRowThreads sums are added in order.
__global__ void finish_kernel(const float* __restrict__ partial_weight,
                              const float* __restrict__ partial_bias, int64_t blocks,
                              int64_t columns, float* __restrict__ grad_weight,
                              float* __restrict__ grad_bias) {
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kColumns + threadIdx.x;
  float weight = 0.f, bias = 0.f;
  if (column < columns) {
    for (int64_t b = threadIdx.y; b < blocks; b += kRowThreads) {
      weight += partial_weight[b * columns + column];
      bias += partial_bias[b * columns + column];
    }
  }
  __shared__ float weights[kRowThreads][kColumns + 1], biases[kRowThreads][kColumns + 1];
  weights[threadIdx.y][threadIdx.x] = weight;
  biases[threadIdx.y][threadIdx.x] = bias;
  __syncthreads();
  if (threadIdx.y != 0 || column >= columns) return;
  for (int i = 1; i < kRowThreads; ++i) {
    weight += weights[i][threadIdx.x];
    bias += biases[i][threadIdx.x];
  }
  grad_weight[column] = weight;
  grad_bias[column] = bias;
}

}  // namespace

int64_t layer_norm_scratch_floats(int64_t rows, int64_t columns) {
  return 2 * row_blocks(rows) * columns;
}

void layer_norm_weight_gradients(const float* grad_output, const float* input, const float* mean,
                                 const float* rstd, int64_t rows, int64_t columns, float* scratch,
                                 float* grad_weight, float* grad_bias, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t blocks = row_blocks(rows);
  float* partial_weight = scratch;
  float* partial_bias = scratch + blocks * columns;
  const dim3 grid(static_cast<unsigned>((columns + kColumns - 1) / kColumns),
                  static_cast<unsigned>(blocks < 65535 ? blocks : 65535));
  partial_sums_kernel<<<grid, dim3(kColumns, kRowThreads), 0, s>>>(
      grad_output, input, mean, rstd, rows, columns, partial_weight, partial_bias);
  check_launch("layer_norm partial sums");
  finish_kernel<<<grid.x, dim3(kColumns, kRowThreads), 0, s>>>(partial_weight, partial_bias, blocks,
                                                               columns, grad_weight, grad_bias);
  check_launch("layer_norm finish");
}

}  // namespace pipetrain::kernels
