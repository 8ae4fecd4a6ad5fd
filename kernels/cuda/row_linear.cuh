// gemm's way into row_linear.cu: products of a few rows against a weight, y = x W^T (+ bias) (+ beta
// * c_in), as a decode step runs them (x [M, K], W [N, K] row-major, 16-bit operands and output,
// fp32 accumulation). gemm (gemm.cu) hands them here; everything else goes to cuBLASLt.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "kernels/kernel.h"

namespace zp::kernels::cuda {

// Runs the product and returns true, or returns false without launching anything when the problem
// is not one the kernel takes (row_linear_fits in kernels/row_linear.h), or when the environment
// variable ZP_DECODE_GEMV is 0 (cuBLASLt for everything: the benchmark's comparison).
// c_in (nullptr: C itself) is read only when beta != 0.
bool decode_gemv(StreamHandle s, DType dt, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B,
                 int64_t ldb, float beta, void* C, int64_t ldc, const void* bias, const void* c_in);

}  // namespace zp::kernels::cuda
