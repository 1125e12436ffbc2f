// cuBLASLt for pipetrain's own GEMMs (those with an epilogue ATen does not ask for, as in
// nn/gelu_gemm.cu): the library's entry points as Torch has loaded them, and one
// cublasLtMatmul with its descriptors. Included by .cu files only.
#pragma once

#include <cublasLt.h>
#include <cublas_api.h>  // CUBLAS_VER_MAJOR
#include <dlfcn.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "gemm_context.h"
#include "kernel_dtype.h"

namespace pipetrain::kernels {

// cuBLASLt's entry points in the library Torch has loaded, whose handle is good with that library
// alone: found by soname among those the process has loaded (RTLD_NOLOAD), never loaded here, so
// that pipetrain neither links a second copy (a toolkit's beside a wheel's: linked, the toolkit's
// would serve every one of Torch's GEMMs too) nor needs one.
struct CublasLt {
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatmulPreferenceCreate) preference_create;
  decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmul) matmul;
  decltype(&cublasLtGetStatusString) status_string;
};

#define PIPETRAIN_STRING(x) #x
#define PIPETRAIN_SONAME(major) "libcublasLt.so." PIPETRAIN_STRING(major)

// Null where no cuBLASLt of the headers' major version is loaded (the callers then use ATen).
inline const CublasLt* cublaslt() {
  static const CublasLt* const api = []() -> const CublasLt* {
    void* library = dlopen(PIPETRAIN_SONAME(CUBLAS_VER_MAJOR), RTLD_NOW | RTLD_NOLOAD);
    if (!library) return nullptr;
    static CublasLt table;
    bool found = true;
    const auto look_up = [&](auto& entry, const char* name) {
      entry = reinterpret_cast<std::remove_reference_t<decltype(entry)>>(dlsym(library, name));
      found = found && entry != nullptr;
    };
    look_up(table.desc_create, "cublasLtMatmulDescCreate");
    look_up(table.desc_destroy, "cublasLtMatmulDescDestroy");
    look_up(table.desc_set, "cublasLtMatmulDescSetAttribute");
    look_up(table.layout_create, "cublasLtMatrixLayoutCreate");
    look_up(table.layout_destroy, "cublasLtMatrixLayoutDestroy");
    look_up(table.preference_create, "cublasLtMatmulPreferenceCreate");
    look_up(table.preference_destroy, "cublasLtMatmulPreferenceDestroy");
    look_up(table.preference_set, "cublasLtMatmulPreferenceSetAttribute");
    look_up(table.heuristic, "cublasLtMatmulAlgoGetHeuristic");
    look_up(table.matmul, "cublasLtMatmul");
    look_up(table.status_string, "cublasLtGetStatusString");
    return found ? &table : nullptr;
  }();
  return api;
}

inline cudaDataType_t cuda_type(Dtype dtype) {
  switch (dtype) {
    case Dtype::kBFloat16:
      return CUDA_R_16BF;
    case Dtype::kHalf:
      return CUDA_R_16F;
    case Dtype::kFloat:
      break;
  }
  return CUDA_R_32F;
}

// One cublasLtMatmul's descriptors, destroyed with it: D = epilogue(op(A) op(B)), column-major as
// cuBLASLt reads, op(A) m x k, op(B) k x n, D m x n with leading dimension m; A, B and D of one
// dtype. Computes in fp32.
class Matmul {
 public:
  Matmul(const CublasLt& api, Dtype dtype, cublasLtEpilogue_t epilogue)
      : lt_(api), type_(cuda_type(dtype)) {
    check(lt_.desc_create(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "descriptor");
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
    check(lt_.preference_create(&preference_), "preference");
  }
  ~Matmul() {
    if (preference_) lt_.preference_destroy(preference_);
    for (auto layout : {a_, b_, d_}) {
      if (layout) lt_.layout_destroy(layout);
    }
    if (desc_) lt_.desc_destroy(desc_);
  }
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  template <typename T>
  void set(cublasLtMatmulDescAttributes_t attribute, const T& value) {
    check(lt_.desc_set(desc_, attribute, &value, sizeof(value)), "attribute");
  }

  // A stored lda-strided as op(A) needs it (k x m where transposed), B likewise; D written. False,
  // with nothing written, where no algorithm fits.
  bool run(const GemmContext& context, bool transpose_a, const void* a, int64_t lda,
           bool transpose_b, const void* b, int64_t ldb, int64_t m, int64_t n, int64_t k, void* d) {
    set(CUBLASLT_MATMUL_DESC_TRANSA, transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N);
    set(CUBLASLT_MATMUL_DESC_TRANSB, transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N);
    check(lt_.layout_create(&a_, type_, transpose_a ? k : m, transpose_a ? m : k, lda), "layout");
    check(lt_.layout_create(&b_, type_, transpose_b ? n : k, transpose_b ? k : n, ldb), "layout");
    check(lt_.layout_create(&d_, type_, m, n, m), "layout");
    const auto prefer = [&](cublasLtMatmulPreferenceAttributes_t attribute, auto value) {
      check(lt_.preference_set(preference_, attribute, &value, sizeof(value)), "preference");
    };
    prefer(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{context.workspace_bytes});
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment(a));
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment(b));
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment(d));
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment(d));
    const auto handle = static_cast<cublasLtHandle_t>(context.handle);
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    const cublasStatus_t status =
        lt_.heuristic(handle, desc_, a_, b_, d_, d_, preference_, 1, &heuristic, &found);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED || found == 0) return false;
    check(status, "heuristic");
    const float one = 1.0f, zero = 0.0f;
    check(lt_.matmul(handle, desc_, &one, a, a_, b, b_, &zero, d, d_, d, d_, &heuristic.algo,
                     context.workspace, context.workspace_bytes,
                     static_cast<cudaStream_t>(context.stream)),
          "matmul");
    return true;
  }

 private:
  void check(cublasStatus_t status, const char* what) const {
    if (status != CUBLAS_STATUS_SUCCESS) {
      throw std::runtime_error(std::string("pipetrain: cuBLASLt ") + what +
                               " failed: " + lt_.status_string(status));
    }
  }

  // The largest power of two up to 256 that `pointer` is a multiple of: the heuristic must not
  // pick an algorithm that assumes more.
  static uint32_t alignment(const void* pointer) {
    uint32_t bytes = 256;
    while (bytes > 1 && reinterpret_cast<uintptr_t>(pointer) % bytes != 0) bytes /= 2;
    return bytes;
  }

  const CublasLt& lt_;
  cudaDataType_t type_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  cublasLtMatmulPreference_t preference_ = nullptr;
};

}  // namespace pipetrain::kernels
