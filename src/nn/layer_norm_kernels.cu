// LayerNorm on a GPU, in three kernels:
// - Rows (forward, input gradient): one warp per row, 4 elements per access; a row of a
//   transformer's width (3-6 KB in fp32) stays in L1 between the passes over it. The forward
//   writes its output in the dtype the next matmul reads (bf16 under autocast), and the input
//   gradient reads that matmul's gradient as it comes: no fp32 copy of either. Both can take a
//   residual add with them (h = x + branch, then LayerNorm(h)): the forward writes h as it sums
//   it, the backward adds h's other gradient and writes the result for both terms of the sum,
//   which saves a pass over the rows each way and the bf16 copy of the branch's gradient.
// - Columns (weight and bias gradients): sums over rows, column by column. ATen's kernel gives
//   each 32 columns one thread block over all the rows: for GPT-2's [16384, 768] that is 24 blocks
//   on an H200's 132 SMs, 79 us where the reads allow about 25. Here each block sums 32 columns
//   over kRowsPerBlock rows (a warp reads 32 adjacent elements of a row at a time), writes its
//   partial sums, and a second kernel adds the partial sums of each column in a fixed order.
#include <cstdint>

#include "kernel_common.cuh"
#include "layer_norm_kernels.h"

namespace pipetrain::kernels {
namespace {

constexpr int kVector = 4;        // elements per access in the row kernels
constexpr int kRowsPerBlock = 8;  // warps (rows) per thread block in the row kernels

template <typename T>
using Vec = Pack<T, kVector>;

// The rows normalised are `input`'s, or, where `branch` is not null, input + branch (in fp32, as
// ATen adds an fp32 tensor and a bf16 one), written to `sum`.
template <typename Out, typename Branch>
__global__ void forward_kernel(const float* __restrict__ input, const Branch* __restrict__ branch,
                               const float* __restrict__ weight, const float* __restrict__ bias,
                               int64_t rows, int64_t columns, float eps, float* __restrict__ sum,
                               Out* __restrict__ output, float* __restrict__ mean_out,
                               float* __restrict__ rstd_out) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (row >= rows) return;
  const int64_t vectors = columns / kVector;
  const float inv_columns = 1.f / static_cast<float>(columns);
  float total = 0.f;
  if (branch != nullptr) {
    const auto* a = reinterpret_cast<const Vec<float>*>(input + row * columns);
    const auto* b = reinterpret_cast<const Vec<Branch>*>(branch + row * columns);
    auto* s = reinterpret_cast<Vec<float>*>(sum + row * columns);
    for (int64_t i = threadIdx.x; i < vectors; i += kWarp) {
      Vec<float> v = a[i];
      const Vec<Branch> add = b[i];
#pragma unroll
      for (int k = 0; k < kVector; ++k) {
        v.v[k] += to_float(add.v[k]);
        total += v.v[k];
      }
      s[i] = v;
    }
  } else {
    const auto* x = reinterpret_cast<const Vec<float>*>(input + row * columns);
    for (int64_t i = threadIdx.x; i < vectors; i += kWarp) {
      const Vec<float> v = x[i];
#pragma unroll
      for (int k = 0; k < kVector; ++k) total += v.v[k];
    }
  }
  // The later passes read the sum where there is one: each lane the elements it wrote itself.
  const float* normalised = branch != nullptr ? sum : input;
  const auto* x = reinterpret_cast<const Vec<float>*>(normalised + row * columns);
  const float mean = warp_sum(total) * inv_columns;
  // Squares about the mean, a second pass: as accurate as Welford's, simpler.
  float squares = 0.f;
  for (int64_t i = threadIdx.x; i < vectors; i += kWarp) {
    const Vec<float> v = x[i];
#pragma unroll
    for (int k = 0; k < kVector; ++k) squares += (v.v[k] - mean) * (v.v[k] - mean);
  }
  const float rstd = rsqrtf(warp_sum(squares) * inv_columns + eps);
  const auto* w = reinterpret_cast<const Vec<float>*>(weight);
  const auto* b = reinterpret_cast<const Vec<float>*>(bias);
  auto* y = reinterpret_cast<Vec<Out>*>(output + row * columns);
  for (int64_t i = threadIdx.x; i < vectors; i += kWarp) {
    const Vec<float> v = x[i], scale = w[i], shift = b[i];
    Vec<Out> out;
#pragma unroll
    for (int k = 0; k < kVector; ++k) {
      out.v[k] = from_float<Out>((v.v[k] - mean) * rstd * scale.v[k] + shift.v[k]);
    }
    y[i] = out;
  }
  if (threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// The LayerNorm's input gradient, plus `grad_sum` where not null (the gradient its input got from
// elsewhere: the residual stream), written in fp32 and, where `grad_branch` is not null, again in
// the branch's dtype (the gradient of both terms of a sum is the sum's).
template <typename Grad, typename Branch>
__global__ void input_gradient_kernel(const Grad* __restrict__ grad_output,
                                      const float* __restrict__ input,
                                      const float* __restrict__ mean_in,
                                      const float* __restrict__ rstd_in,
                                      const float* __restrict__ weight, int64_t rows,
                                      int64_t columns, const float* __restrict__ grad_sum,
                                      float* __restrict__ grad_input,
                                      Branch* __restrict__ grad_branch) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (row >= rows) return;
  const int64_t vectors = columns / kVector;
  const auto* dy = reinterpret_cast<const Vec<Grad>*>(grad_output + row * columns);
  const auto* x = reinterpret_cast<const Vec<float>*>(input + row * columns);
  const auto* w = reinterpret_cast<const Vec<float>*>(weight);
  const float mean = mean_in[row], rstd = rstd_in[row];
  float sum_g = 0.f, sum_gx = 0.f;
  for (int64_t i = threadIdx.x; i < vectors; i += kWarp) {
    const Vec<Grad> d = dy[i];
    const Vec<float> v = x[i], scale = w[i];
#pragma unroll
    for (int k = 0; k < kVector; ++k) {
      const float g = to_float(d.v[k]) * scale.v[k];
      sum_g += g;
      sum_gx += g * (v.v[k] - mean) * rstd;
    }
  }
  const float inv_columns = 1.f / static_cast<float>(columns);
  const float mean_g = warp_sum(sum_g) * inv_columns, mean_gx = warp_sum(sum_gx) * inv_columns;
  const auto* residual =
      grad_sum ? reinterpret_cast<const Vec<float>*>(grad_sum + row * columns) : nullptr;
  auto* dx = reinterpret_cast<Vec<float>*>(grad_input + row * columns);
  auto* db = grad_branch ? reinterpret_cast<Vec<Branch>*>(grad_branch + row * columns) : nullptr;
  for (int64_t i = threadIdx.x; i < vectors; i += kWarp) {
    const Vec<Grad> d = dy[i];
    const Vec<float> v = x[i], scale = w[i];
    Vec<float> out = residual ? residual[i] : Vec<float>{};
#pragma unroll
    for (int k = 0; k < kVector; ++k) {
      const float g = to_float(d.v[k]) * scale.v[k];
      out.v[k] += rstd * (g - mean_g - (v.v[k] - mean) * rstd * mean_gx);
    }
    dx[i] = out;
    if (db) {
      Vec<Branch> narrow;
#pragma unroll
      for (int k = 0; k < kVector; ++k) narrow.v[k] = from_float<Branch>(out.v[k]);
      db[i] = narrow;
    }
  }
}

constexpr int kColumns = 32;    // per block: one warp's width
constexpr int kRowThreads = 8;  // warps per block, each taking every 8th row
constexpr int kRowsPerSum = 256;

int64_t row_blocks(int64_t rows) { return (rows + kRowsPerSum - 1) / kRowsPerSum; }

template <typename Grad>
__global__ void partial_sums_kernel(const Grad* __restrict__ grad_output,
                                    const float* __restrict__ input, const float* __restrict__ mean,
                                    const float* __restrict__ rstd, int64_t rows, int64_t columns,
                                    float* __restrict__ partial_weight,
                                    float* __restrict__ partial_bias) {
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kColumns + threadIdx.x;
  __shared__ float weights[kRowThreads][kColumns + 1], biases[kRowThreads][kColumns + 1];
  // Row block by row block (the grid's y is at most 65535 blocks).
  for (int64_t block = blockIdx.y; block * kRowsPerSum < rows; block += gridDim.y) {
    const int64_t first = block * kRowsPerSum;
    const int64_t end = first + kRowsPerSum < rows ? first + kRowsPerSum : rows;
    float weight = 0.f, bias = 0.f;
    if (column < columns) {
      for (int64_t row = first + threadIdx.y; row < end; row += kRowThreads) {
        const int64_t at = row * columns + column;
        const float g = to_float(grad_output[at]);
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

// Calls f(T{}) with T the element type `dtype` names.
template <typename F>
void with_element_type(Dtype dtype, F&& f) {
  switch (dtype) {
    case Dtype::kFloat:
      return f(float{});
    case Dtype::kBFloat16:
      return f(__nv_bfloat16{});
    case Dtype::kHalf:
      return f(__half{});
  }
}

dim3 row_grid(int64_t rows) {
  return dim3(static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock));
}

}  // namespace

bool layer_norm_takes_columns(int64_t columns) { return columns > 0 && columns % kVector == 0; }

void add_layer_norm_forward(const float* input, Dtype branch_dtype, const void* branch,
                            const float* weight, const float* bias, int64_t rows, int64_t columns,
                            double eps, float* sum, Dtype output_dtype, void* output, float* mean,
                            float* rstd, void* stream) {
  with_element_type(output_dtype, [&](auto out_zero) {
    with_element_type(branch_dtype, [&](auto branch_zero) {
      using Out = decltype(out_zero);
      using Branch = decltype(branch_zero);
      forward_kernel<Out, Branch>
          <<<row_grid(rows), dim3(kWarp, kRowsPerBlock), 0, static_cast<cudaStream_t>(stream)>>>(
              input, static_cast<const Branch*>(branch), weight, bias, rows, columns,
              static_cast<float>(eps), sum, static_cast<Out*>(output), mean, rstd);
    });
  });
  check_launch("layer_norm forward");
}

void layer_norm_forward(const float* input, const float* weight, const float* bias, int64_t rows,
                        int64_t columns, double eps, Dtype output_dtype, void* output, float* mean,
                        float* rstd, void* stream) {
  add_layer_norm_forward(input, Dtype::kFloat, nullptr, weight, bias, rows, columns, eps, nullptr,
                         output_dtype, output, mean, rstd, stream);
}

void layer_norm_input_gradient(Dtype grad_dtype, const void* grad_output, const float* input,
                               const float* mean, const float* rstd, const float* weight,
                               int64_t rows, int64_t columns, const float* grad_sum,
                               float* grad_input, Dtype branch_dtype, void* grad_branch,
                               void* stream) {
  with_element_type(grad_dtype, [&](auto grad_zero) {
    with_element_type(branch_dtype, [&](auto branch_zero) {
      using Grad = decltype(grad_zero);
      using Branch = decltype(branch_zero);
      input_gradient_kernel<Grad, Branch>
          <<<row_grid(rows), dim3(kWarp, kRowsPerBlock), 0, static_cast<cudaStream_t>(stream)>>>(
              static_cast<const Grad*>(grad_output), input, mean, rstd, weight, rows, columns,
              grad_sum, grad_input, static_cast<Branch*>(grad_branch));
    });
  });
  check_launch("layer_norm input gradient");
}

int64_t layer_norm_scratch_floats(int64_t rows, int64_t columns) {
  return 2 * row_blocks(rows) * columns;
}

void layer_norm_weight_gradients(Dtype grad_dtype, const void* grad_output, const float* input,
                                 const float* mean, const float* rstd, int64_t rows,
                                 int64_t columns, float* scratch, float* grad_weight,
                                 float* grad_bias, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t blocks = row_blocks(rows);
  float* partial_weight = scratch;
  float* partial_bias = scratch + blocks * columns;
  const dim3 grid(static_cast<unsigned>((columns + kColumns - 1) / kColumns),
                  static_cast<unsigned>(blocks < 65535 ? blocks : 65535));
  with_element_type(grad_dtype, [&](auto zero) {
    using Grad = decltype(zero);
    partial_sums_kernel<Grad><<<grid, dim3(kColumns, kRowThreads), 0, s>>>(
        static_cast<const Grad*>(grad_output), input, mean, rstd, rows, columns, partial_weight,
        partial_bias);
  });
  check_launch("layer_norm partial sums");
  finish_kernel<<<grid.x, dim3(kColumns, kRowThreads), 0, s>>>(partial_weight, partial_bias, blocks,
                                                               columns, grad_weight, grad_bias);
  check_launch("layer_norm finish");
}

}  // namespace pipetrain::kernels
