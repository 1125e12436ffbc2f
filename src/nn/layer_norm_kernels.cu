// LayerNorm and RMSNorm on a GPU, in three kernels. An RMSNorm is a LayerNorm whose mean is 0
// and which has no bias, so the kernels take it as a template argument (kNorm) and leave out what
// it does not have: the mean and its sums, the bias and its gradient.
// - Rows (forward, input gradient): one warp per row, 4 elements per access; a row of a
//   transformer's width (3-16 KB in fp32) stays in cache between the passes over it. The forward
//   writes its output in the dtype the next matmul reads (bf16 under autocast), and the input
//   gradient reads that matmul's gradient as it comes: no fp32 copy of either. Both can take a
//   residual add with them (h = x + branch, then the norm of h): the forward writes h as it sums
//   it, the backward adds h's other gradient and writes the result for both terms of the sum,
//   which saves a pass over the rows each way and the bf16 copy of the branch's gradient.
// - Columns (weight and bias gradients): sums over rows, column by column. ATen's kernel gives
//   each 32 columns one thread block over all the rows: for GPT-2's [16384, 768] that is 24 blocks
//   on an H200's 132 SMs, 79 us where the reads allow about 25. Here each block sums 32 columns
//   over kRowsPerBlock rows (a warp reads 32 adjacent elements of a row at a time), writes its
//   partial sums, and a second kernel adds the partial sums of each column in a fixed order.
// - Both at once (gradients_kernel): where a lane can hold the sums of the columns it reads, the
//   input gradient's pass sums the weight's gradient as well, over a few rows per warp, and the
//   column pass is not needed: it read every row again (on GPT-2 124M, 25 of them a step took
//   0.94 ms). On an H200 (bench/kernel_bench.cu) a [16384, 768] backward with the residual stream's
//   gradient and the bf16 branch's takes 0.068 ms for an RMSNorm and 0.075 for a LayerNorm, about
//   3.0 and 2.7 TB/s where a copy moves 4.3 (0.077 and 0.084 before the residual gradient was read
//   in the first pass): each row's second pass waits on the first pass's sums.
#include <cstdint>
#include <type_traits>

#include "layer_norm_kernels.h"
#include "util/kernel_common.cuh"

namespace pipetrain::kernels {
namespace {

constexpr int kVector = 4;        // elements per access in the row kernels
constexpr int kRowsPerBlock = 8;  // warps (rows) per thread block in the row kernels

template <typename T>
using Vec = Pack<T, kVector>;

// The rows normalised are `input`'s, or, where `branch` is not null, input + branch (in fp32, as
// ATen adds an fp32 tensor and a bf16 one), written to `sum`.
template <Norm kNorm, typename Out, typename Branch>
__global__ void forward_kernel(const float* __restrict__ input, const Branch* __restrict__ branch,
                               const float* __restrict__ weight, const float* __restrict__ bias,
                               int64_t rows, int64_t columns, float eps, float* __restrict__ sum,
                               Out* __restrict__ output, float* __restrict__ mean_out,
                               float* __restrict__ rstd_out) {
  constexpr bool kCentred = kNorm == Norm::kLayerNorm;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (row >= rows) return;
  const int64_t vectors = columns / kVector;
  const float inv_columns = 1.f / static_cast<float>(columns);
  // The first pass sums a LayerNorm's values (for its mean) and an RMSNorm's squares (about its
  // mean, 0: all it needs).
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
        total += kCentred ? v.v[k] : v.v[k] * v.v[k];
      }
      s[i] = v;
    }
  } else {
    const auto* x = reinterpret_cast<const Vec<float>*>(input + row * columns);
    for (int64_t i = threadIdx.x; i < vectors; i += kWarp) {
      const Vec<float> v = x[i];
#pragma unroll
      for (int k = 0; k < kVector; ++k) total += kCentred ? v.v[k] : v.v[k] * v.v[k];
    }
  }
  // The later passes read the sum where there is one: each lane the elements it wrote itself.
  const float* normalised = branch != nullptr ? sum : input;
  const auto* x = reinterpret_cast<const Vec<float>*>(normalised + row * columns);
  const float mean = kCentred ? warp_sum(total) * inv_columns : 0.f;
  float variance = 0.f;
  if constexpr (kCentred) {
    // Squares about the mean, a second pass: as accurate as Welford's, simpler.
    float squares = 0.f;
    for (int64_t i = threadIdx.x; i < vectors; i += kWarp) {
      const Vec<float> v = x[i];
#pragma unroll
      for (int k = 0; k < kVector; ++k) squares += (v.v[k] - mean) * (v.v[k] - mean);
    }
    variance = warp_sum(squares) * inv_columns;
  } else {
    variance = warp_sum(total) * inv_columns;
  }
  const float rstd = rsqrtf(variance + eps);
  const auto* w = reinterpret_cast<const Vec<float>*>(weight);
  const auto* b = reinterpret_cast<const Vec<float>*>(bias);
  auto* y = reinterpret_cast<Vec<Out>*>(output + row * columns);
  for (int64_t i = threadIdx.x; i < vectors; i += kWarp) {
    const Vec<float> v = x[i], scale = w[i];
    const Vec<float> shift = kCentred ? b[i] : Vec<float>{};
    Vec<Out> out;
#pragma unroll
    for (int k = 0; k < kVector; ++k) {
      const float scaled = (v.v[k] - mean) * rstd * scale.v[k];
      out.v[k] = from_float<Out>(kCentred ? scaled + shift.v[k] : scaled);
    }
    y[i] = out;
  }
  if (threadIdx.x == 0) {
    if constexpr (kCentred) mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// Vector i of a row's input gradient, given the row's mean_j(g) and mean_j(g * xhat), added to
// `out` (the residual stream's gradient there, or zeros); written to dx and, where not null, to db
// in the branch's dtype.
template <typename Grad, typename Branch>
__device__ inline void write_input_gradient(int64_t i, const Vec<Grad>* dy, const Vec<float>* x,
                                            const Vec<float>* w, Vec<float> out, float mean,
                                            float rstd, float mean_g, float mean_gx, Vec<float>* dx,
                                            Vec<Branch>* db) {
  const Vec<Grad> d = dy[i];
  const Vec<float> v = x[i], scale = w[i];
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

// The norm's input gradient, plus `grad_sum` where not null (the gradient its input got from
// elsewhere: the residual stream), written in fp32 and, where `grad_branch` is not null, again in
// the branch's dtype (the gradient of both terms of a sum is the sum's).
template <Norm kNorm, typename Grad, typename Branch>
__global__ void input_gradient_kernel(const Grad* __restrict__ grad_output,
                                      const float* __restrict__ input,
                                      const float* __restrict__ mean_in,
                                      const float* __restrict__ rstd_in,
                                      const float* __restrict__ weight, int64_t rows,
                                      int64_t columns, const float* __restrict__ grad_sum,
                                      float* __restrict__ grad_input,
                                      Branch* __restrict__ grad_branch) {
  constexpr bool kCentred = kNorm == Norm::kLayerNorm;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (row >= rows) return;
  const int64_t vectors = columns / kVector;
  const auto* dy = reinterpret_cast<const Vec<Grad>*>(grad_output + row * columns);
  const auto* x = reinterpret_cast<const Vec<float>*>(input + row * columns);
  const auto* w = reinterpret_cast<const Vec<float>*>(weight);
  const float mean = kCentred ? mean_in[row] : 0.f, rstd = rstd_in[row];
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
  // An RMSNorm's output does not move with its input's mean: no mean_j(g) term.
  const float mean_g = kCentred ? warp_sum(sum_g) * inv_columns : 0.f,
              mean_gx = warp_sum(sum_gx) * inv_columns;
  const auto* residual =
      grad_sum ? reinterpret_cast<const Vec<float>*>(grad_sum + row * columns) : nullptr;
  auto* dx = reinterpret_cast<Vec<float>*>(grad_input + row * columns);
  auto* db = grad_branch ? reinterpret_cast<Vec<Branch>*>(grad_branch + row * columns) : nullptr;
  for (int64_t i = threadIdx.x; i < vectors; i += kWarp) {
    write_input_gradient(i, dy, x, w, residual ? residual[i] : Vec<float>{}, mean, rstd, mean_g,
                         mean_gx, dx, db);
  }
}

// At most this many floats of partial sums per lane in gradients_kernel (registers).
constexpr int kMaxSumsPerLane = 64;
// Rows each warp of gradients_kernel takes, one after another: at 8, the blocks of [16384, 768] or
// [16384, 2048] (256) all run at once, two an SM, and finish_kernel adds 256 partial rows.
constexpr int kRowsPerWarp = 8;

int64_t gradient_blocks(int64_t rows) {
  const int64_t rows_per_block = int64_t{kRowsPerBlock} * kRowsPerWarp;
  return (rows + rows_per_block - 1) / rows_per_block;
}

// input_gradient_kernel's rows and the weight's (and bias's) gradients in one pass: each lane sums
// grad_output * xhat (and grad_output) for the columns it reads over its warp's kRowsPerWarp rows,
// in registers (kSlots vectors of 4 per lane: columns <= kSlots * 128), the block's warps add
// theirs in order in shared memory, and the block writes one row of partial sums that
// finish_kernel adds up. A fixed order throughout: the same result every run.
template <Norm kNorm, typename Grad, typename Branch, int kSlots>
__global__ void gradients_kernel(const Grad* __restrict__ grad_output,
                                 const float* __restrict__ input, const float* __restrict__ mean_in,
                                 const float* __restrict__ rstd_in,
                                 const float* __restrict__ weight, int64_t rows, int64_t columns,
                                 const float* __restrict__ grad_sum, float* __restrict__ grad_input,
                                 Branch* __restrict__ grad_branch,
                                 float* __restrict__ partial_weight,
                                 float* __restrict__ partial_bias) {
  constexpr bool kCentred = kNorm == Norm::kLayerNorm;
  // The residual gradient is read in the first pass beside grad_output, into registers, where
  // they are left: the second pass then waits on no new read of it. Up to 6 vectors a lane (768
  // columns; [16384, 768] on an H100: RMSNorm 0.094 -> 0.086 ms, LayerNorm 0.101 -> 0.093; on an
  // H200 0.077 -> 0.068 and 0.084 -> 0.075), and 8 (1024) for an RMSNorm alone: on an H100
  // [16384, 1024] RMSNorm 0.129 -> 0.119 ms, but a LayerNorm's lanes then need ~145 registers,
  // one block an SM where two ran: 0.134 -> 0.156. At 16, 2048 columns, slower (0.273 -> 0.291).
  constexpr bool kResidualInRegisters = kSlots <= 6 || (!kCentred && kSlots <= 8);
  extern __shared__ float block_sums[];  // the weight's columns, then a LayerNorm's bias's
  const int64_t vectors = columns / kVector;
  const int lane = threadIdx.x;
  const auto* w = reinterpret_cast<const Vec<float>*>(weight);
  const float inv_columns = 1.f / static_cast<float>(columns);
  float weight_sums[kSlots][kVector] = {}, bias_sums[kSlots][kVector] = {};
  const int64_t first =
      (static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y) * kRowsPerWarp;
  for (int64_t row = first; row < first + kRowsPerWarp && row < rows; ++row) {
    const auto* dy = reinterpret_cast<const Vec<Grad>*>(grad_output + row * columns);
    const auto* x = reinterpret_cast<const Vec<float>*>(input + row * columns);
    const auto* residual =
        grad_sum ? reinterpret_cast<const Vec<float>*>(grad_sum + row * columns) : nullptr;
    const float mean = kCentred ? mean_in[row] : 0.f, rstd = rstd_in[row];
    float sum_g = 0.f, sum_gx = 0.f;
    Vec<float> residual_held[kResidualInRegisters ? kSlots : 1];
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) {
      const int64_t i = lane + slot * kWarp;
      if (i >= vectors) break;
      const Vec<Grad> d = dy[i];
      const Vec<float> v = x[i], scale = w[i];
      if constexpr (kResidualInRegisters)
        residual_held[slot] = residual ? residual[i] : Vec<float>{};
#pragma unroll
      for (int k = 0; k < kVector; ++k) {
        const float dk = to_float(d.v[k]), xhat = (v.v[k] - mean) * rstd;
        const float g = dk * scale.v[k];
        sum_g += g;
        sum_gx += g * xhat;
        weight_sums[slot][k] += dk * xhat;
        if constexpr (kCentred) bias_sums[slot][k] += dk;
      }
    }
    const float mean_g = kCentred ? warp_sum(sum_g) * inv_columns : 0.f,
                mean_gx = warp_sum(sum_gx) * inv_columns;
    auto* dx = reinterpret_cast<Vec<float>*>(grad_input + row * columns);
    auto* db = grad_branch ? reinterpret_cast<Vec<Branch>*>(grad_branch + row * columns) : nullptr;
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) {
      const int64_t i = lane + slot * kWarp;
      if (i >= vectors) break;
      Vec<float> start;
      if constexpr (kResidualInRegisters) {
        start = residual_held[slot];
      } else {
        start = residual ? residual[i] : Vec<float>{};
      }
      write_input_gradient(i, dy, x, w, start, mean, rstd, mean_g, mean_gx, dx, db);
    }
  }
  // The block's warps add their sums in shared memory, warp 0's first.
  for (int warp = 0; warp < kRowsPerBlock; ++warp) {
    if (threadIdx.y == warp) {
#pragma unroll
      for (int slot = 0; slot < kSlots; ++slot) {
        const int64_t i = lane + slot * kWarp;
        if (i >= vectors) break;
#pragma unroll
        for (int k = 0; k < kVector; ++k) {
          const int64_t column = i * kVector + k;
          block_sums[column] = (warp == 0 ? 0.f : block_sums[column]) + weight_sums[slot][k];
          if constexpr (kCentred) {
            block_sums[columns + column] =
                (warp == 0 ? 0.f : block_sums[columns + column]) + bias_sums[slot][k];
          }
        }
      }
    }
    __syncthreads();
  }
  for (int64_t column = threadIdx.y * kWarp + lane; column < columns;
       column += kWarp * kRowsPerBlock) {
    partial_weight[blockIdx.x * columns + column] = block_sums[column];
    if constexpr (kCentred)
      partial_bias[blockIdx.x * columns + column] = block_sums[columns + column];
  }
}

constexpr int kColumns = 32;    // per block: one warp's width
constexpr int kRowThreads = 8;  // warps per block, each taking every 8th row
constexpr int kRowsPerSum = 256;

int64_t row_blocks(int64_t rows) { return (rows + kRowsPerSum - 1) / kRowsPerSum; }

template <Norm kNorm, typename Grad>
__global__ void partial_sums_kernel(const Grad* __restrict__ grad_output,
                                    const float* __restrict__ input, const float* __restrict__ mean,
                                    const float* __restrict__ rstd, int64_t rows, int64_t columns,
                                    float* __restrict__ partial_weight,
                                    float* __restrict__ partial_bias) {
  constexpr bool kCentred = kNorm == Norm::kLayerNorm;
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
        weight += g * (input[at] - (kCentred ? mean[row] : 0.f)) * rstd[row];
        bias += g;
      }
    }
    weights[threadIdx.y][threadIdx.x] = weight;
    if constexpr (kCentred) biases[threadIdx.y][threadIdx.x] = bias;
    __syncthreads();
    if (threadIdx.y == 0 && column < columns) {
      for (int i = 1; i < kRowThreads; ++i) {
        weight += weights[i][threadIdx.x];
        if constexpr (kCentred) bias += biases[i][threadIdx.x];
      }
      partial_weight[block * columns + column] = weight;
      if constexpr (kCentred) partial_bias[block * columns + column] = bias;
    }
    __syncthreads();  // before the next row block overwrites the shared sums
  }
}

// The partial sums of each column added in a fixed order: thread (x, y) takes every
// kFinishThreads-th row block from y, and the kFinishThreads sums are added in order. 32 warps a
// block: the columns give few blocks (24 for 768), so each needs many reads in flight.
constexpr int kFinishThreads = 32;

template <Norm kNorm>
__global__ void finish_kernel(const float* __restrict__ partial_weight,
                              const float* __restrict__ partial_bias, int64_t blocks,
                              int64_t columns, float* __restrict__ grad_weight,
                              float* __restrict__ grad_bias) {
  constexpr bool kCentred = kNorm == Norm::kLayerNorm;
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kColumns + threadIdx.x;
  float weight = 0.f, bias = 0.f;
  if (column < columns) {
    for (int64_t b = threadIdx.y; b < blocks; b += kFinishThreads) {
      weight += partial_weight[b * columns + column];
      if constexpr (kCentred) bias += partial_bias[b * columns + column];
    }
  }
  __shared__ float weights[kFinishThreads][kColumns + 1], biases[kFinishThreads][kColumns + 1];
  weights[threadIdx.y][threadIdx.x] = weight;
  if constexpr (kCentred) biases[threadIdx.y][threadIdx.x] = bias;
  __syncthreads();
  if (threadIdx.y != 0 || column >= columns) return;
  for (int i = 1; i < kFinishThreads; ++i) {
    weight += weights[i][threadIdx.x];
    if constexpr (kCentred) bias += biases[i][threadIdx.x];
  }
  grad_weight[column] = weight;
  if constexpr (kCentred) grad_bias[column] = bias;
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

// Calls f(N{}) with N::value `norm`, for the kernels' template argument.
template <typename F>
void with_norm(Norm norm, F&& f) {
  switch (norm) {
    case Norm::kLayerNorm:
      return f(std::integral_constant<Norm, Norm::kLayerNorm>{});
    case Norm::kRmsNorm:
      return f(std::integral_constant<Norm, Norm::kRmsNorm>{});
  }
}

// The row kernels' template arguments: the norm, the element type of the tensor each takes besides
// fp32 rows (the forward's output, the incoming gradient of the input gradient's) and the branch's.
template <Norm kNorm, typename T, typename B>
struct RowTypes {
  static constexpr Norm norm = kNorm;
  using Element = T;
  using Branch = B;
};

// Calls f(RowTypes<...>{}) for `norm` and the element types `element` and `branch` name.
template <typename F>
void with_row_types(Norm norm, Dtype element, Dtype branch, F&& f) {
  with_norm(norm, [&](auto norm_constant) {
    with_element_type(element, [&](auto element_zero) {
      with_element_type(branch, [&](auto branch_zero) {
        f(RowTypes<decltype(norm_constant)::value, decltype(element_zero),
                   decltype(branch_zero)>{});
      });
    });
  });
}

dim3 row_grid(int64_t rows) {
  return dim3(static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock));
}

}  // namespace

bool norm_takes_columns(int64_t columns) { return columns > 0 && columns % kVector == 0; }

void norm_forward(Norm norm, const float* input, Dtype branch_dtype, const void* branch,
                  const float* weight, const float* bias, int64_t rows, int64_t columns, double eps,
                  float* sum, Dtype output_dtype, void* output, float* mean, float* rstd,
                  void* stream) {
  with_row_types(norm, output_dtype, branch_dtype, [&](auto types) {
    using Out = typename decltype(types)::Element;
    using Branch = typename decltype(types)::Branch;
    forward_kernel<decltype(types)::norm, Out, Branch>
        <<<row_grid(rows), dim3(kWarp, kRowsPerBlock), 0, static_cast<cudaStream_t>(stream)>>>(
            input, static_cast<const Branch*>(branch), weight, bias, rows, columns,
            static_cast<float>(eps), sum, static_cast<Out*>(output), mean, rstd);
  });
  check_launch("norm forward");
}

namespace {

// The vectors of 4 a lane sums in gradients_kernel (its kSlots) for rows of `columns`: the
// fewest of 2, 4, 6, 8, 12, 16 that covers the row (6 for a width of 768: no registers held for
// slots a row never fills), or 0 where the sums would not fit kMaxSumsPerLane.
int gradient_slots(Norm norm, int64_t columns) {
  const int64_t per_lane = (columns / kVector + kWarp - 1) / kWarp;
  const int sums = norm == Norm::kLayerNorm ? 2 : 1;
  for (const int slots : {2, 4, 6, 8, 12, 16}) {
    if (per_lane <= slots) return slots * kVector * sums <= kMaxSumsPerLane ? slots : 0;
  }
  return 0;
}

// Calls f(S{}) with S::value `slots` (one of gradient_slots's).
template <typename F>
void with_slots(int slots, F&& f) {
  switch (slots) {
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 6:
      return f(std::integral_constant<int, 6>{});
    case 8:
      return f(std::integral_constant<int, 8>{});
    case 12:
      return f(std::integral_constant<int, 12>{});
    default:
      return f(std::integral_constant<int, 16>{});
  }
}

void input_gradient(Norm norm, Dtype grad_dtype, const void* grad_output, const float* input,
                    const float* mean, const float* rstd, const float* weight, int64_t rows,
                    int64_t columns, const float* grad_sum, float* grad_input, Dtype branch_dtype,
                    void* grad_branch, cudaStream_t stream) {
  with_row_types(norm, grad_dtype, branch_dtype, [&](auto types) {
    using Grad = typename decltype(types)::Element;
    using Branch = typename decltype(types)::Branch;
    input_gradient_kernel<decltype(types)::norm, Grad, Branch>
        <<<row_grid(rows), dim3(kWarp, kRowsPerBlock), 0, stream>>>(
            static_cast<const Grad*>(grad_output), input, mean, rstd, weight, rows, columns,
            grad_sum, grad_input, static_cast<Branch*>(grad_branch));
  });
  check_launch("norm input gradient");
}

// partial_sums_kernel's partial sums over `rows`, then finish_kernel.
void weight_gradients(Norm norm, Dtype grad_dtype, const void* grad_output, const float* input,
                      const float* mean, const float* rstd, int64_t rows, int64_t columns,
                      float* scratch, float* grad_weight, float* grad_bias, cudaStream_t stream) {
  const int64_t blocks = row_blocks(rows);
  float* partial_weight = scratch;
  float* partial_bias = norm == Norm::kLayerNorm ? scratch + blocks * columns : nullptr;
  const dim3 grid(static_cast<unsigned>((columns + kColumns - 1) / kColumns),
                  static_cast<unsigned>(blocks < 65535 ? blocks : 65535));
  with_norm(norm, [&](auto norm_constant) {
    constexpr Norm kNorm = decltype(norm_constant)::value;
    with_element_type(grad_dtype, [&](auto zero) {
      using Grad = decltype(zero);
      partial_sums_kernel<kNorm, Grad><<<grid, dim3(kColumns, kRowThreads), 0, stream>>>(
          static_cast<const Grad*>(grad_output), input, mean, rstd, rows, columns, partial_weight,
          partial_bias);
    });
    check_launch("norm partial sums");
    finish_kernel<kNorm><<<grid.x, dim3(kColumns, kFinishThreads), 0, stream>>>(
        partial_weight, partial_bias, blocks, columns, grad_weight, grad_bias);
    check_launch("norm finish");
  });
}

}  // namespace

int64_t norm_scratch_floats(Norm norm, int64_t rows, int64_t columns) {
  const int64_t sums = norm == Norm::kLayerNorm ? 2 : 1;  // weight's and bias's, or weight's
  const int64_t partial_rows =
      gradient_slots(norm, columns) > 0 ? gradient_blocks(rows) : row_blocks(rows);
  return sums * partial_rows * columns;
}

void norm_gradients(Norm norm, Dtype grad_dtype, const void* grad_output, const float* input,
                    const float* mean, const float* rstd, const float* weight, int64_t rows,
                    int64_t columns, const float* grad_sum, float* grad_input, Dtype branch_dtype,
                    void* grad_branch, float* scratch, float* grad_weight, float* grad_bias,
                    void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const int slots = gradient_slots(norm, columns);
  if (grad_weight == nullptr || grad_input == nullptr || slots == 0) {
    if (grad_input != nullptr) {
      input_gradient(norm, grad_dtype, grad_output, input, mean, rstd, weight, rows, columns,
                     grad_sum, grad_input, branch_dtype, grad_branch, s);
    }
    if (grad_weight != nullptr) {
      weight_gradients(norm, grad_dtype, grad_output, input, mean, rstd, rows, columns, scratch,
                       grad_weight, grad_bias, s);
    }
    return;
  }
  const int64_t blocks = gradient_blocks(rows);
  float* partial_weight = scratch;
  float* partial_bias = norm == Norm::kLayerNorm ? scratch + blocks * columns : nullptr;
  const size_t shared =
      sizeof(float) * static_cast<size_t>(columns) * (norm == Norm::kLayerNorm ? 2 : 1);
  with_row_types(norm, grad_dtype, branch_dtype, [&](auto types) {
    using Grad = typename decltype(types)::Element;
    using Branch = typename decltype(types)::Branch;
    with_slots(slots, [&](auto slots_constant) {
      gradients_kernel<decltype(types)::norm, Grad, Branch, decltype(slots_constant)::value>
          <<<static_cast<unsigned>(blocks), dim3(kWarp, kRowsPerBlock), shared, s>>>(
              static_cast<const Grad*>(grad_output), input, mean, rstd, weight, rows, columns,
              grad_sum, grad_input, static_cast<Branch*>(grad_branch), partial_weight,
              partial_bias);
    });
  });
  check_launch("norm gradients");
  with_norm(norm, [&](auto norm_constant) {
    finish_kernel<decltype(norm_constant)::value>
        <<<static_cast<unsigned>((columns + kColumns - 1) / kColumns),
           dim3(kColumns, kFinishThreads), 0, s>>>(partial_weight, partial_bias, blocks, columns,
                                                   grad_weight, grad_bias);
  });
  check_launch("norm finish");
}

}  // namespace pipetrain::kernels
