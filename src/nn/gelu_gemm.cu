#include "gelu_gemm.h"

#include "util/cublaslt.cuh"

namespace pipetrain::kernels {

// Row-major [rows, out] is column-major out x rows: output^T = (weight^T)^T-as-stored x^T, i.e.
// A = weight (stored in x out, transposed), B = x (in x rows), m = out, n = rows, k = in.
bool linear_gelu(Dtype dtype, const GemmContext& context, const void* x, const void* weight,
                 const void* bias, int64_t rows, int64_t in, int64_t out, void* output, void* pre) {
  const CublasLt* api = cublaslt();
  if (!api) return false;
  Matmul matmul(*api, dtype, bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX);
  if (bias) matmul.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  matmul.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, pre);
  matmul.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{out});
  return matmul.run(context, true, weight, in, false, x, in, out, rows, in, output);
}

// grad_pre^T (hidden x rows) = weight^T (weight [out, hidden] stored hidden x out) x grad^T
// (out x rows): A = weight untransposed, B = grad, m = hidden, n = rows, k = out.
bool gelu_input_gradient(Dtype dtype, const GemmContext& context, const void* grad,
                         const void* weight, const void* pre, int64_t rows, int64_t out,
                         int64_t hidden, void* grad_pre) {
  const CublasLt* api = cublaslt();
  if (!api) return false;
  Matmul matmul(*api, dtype, CUBLASLT_EPILOGUE_DGELU);
  matmul.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, pre);
  matmul.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{hidden});
  return matmul.run(context, false, weight, hidden, false, grad, out, hidden, rows, out, grad_pre);
}

}  // namespace pipetrain::kernels
