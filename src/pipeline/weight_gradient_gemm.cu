#include "weight_gradient_gemm.h"

#include "util/cublaslt.cuh"

namespace pipetrain::kernels {

// Row-major grad_weight [out, in] is column-major in x out: x^T (x [rows, in] stored in x rows,
// as is) times grad (stored out x rows, transposed): A = x, B = grad^T, m = in, n = out,
// k = rows. The bias gradient sums op(B) over k: BGRADB, one value per column of D (per output).
bool weight_and_bias_gradients(Dtype dtype, const GemmContext& context, const void* grad,
                               const void* x, int64_t rows, int64_t in, int64_t out,
                               bool accumulate, float* grad_weight, float* grad_bias) {
  const CublasLt* api = cublaslt();
  if (!api) return false;
  Matmul matmul(*api, dtype, Dtype::kFloat, CUBLASLT_EPILOGUE_BGRADB);
  matmul.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<void*>(grad_bias));
  matmul.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, CUDA_R_32F);
  return matmul.run(context, false, x, in, true, grad, out, in, out, rows, grad_weight, accumulate);
}

}  // namespace pipetrain::kernels
