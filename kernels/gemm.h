// Matrix products (row-major GEMM with fused bias / GELU epilogues) and the bias gradient.
//
// gemm computes, for each of `batch` problems b,
//   pre  = alpha * op(A_b) @ op(B_b) + beta * C_b + bias      (bias only for Bias / BiasGelu)
// where C_b is read from `c_in` instead when it is given (same layout as C: a residual added in the
// same pass, e.g. y = x W^T + b + r with beta = 1), and the result is written to C.
//   C_b  = gelu(pre) for Gelu / BiasGelu, else pre
//   aux_b = pre                                               (Gelu / BiasGelu, when aux != nullptr)
// and for DGelu (the GELU backward fused into the input-gradient GEMM; aux is read, not written):
//   C_b  = (alpha * op(A_b) @ op(B_b) + beta * C_b) * gelu'(aux_b)
// Row-major: op(A) is [M,K] (A stored [M,K] with lda >= K, or [K,M] with lda >= M when trans_a);
// op(B) is [K,N] (B stored [K,N] with ldb >= N, or [N,K] with ldb >= K when trans_b); C is [M,N]
// with ldc >= N. Problem b starts at A + b*stride_a, B + b*stride_b, C + b*stride_c (elements);
// a stride of 0 reuses the same matrix for every problem (e.g. one weight for a batch).
// A, B and bias are ab_dt (F32, BF16, F16; the CPU also F64). C and aux are c_dt, which is ab_dt or
// F32: bf16 operands with an fp32 C and beta = 1 accumulate a weight gradient in fp32.
// aux is contiguous [batch, M, N] (leading dimension N): the pre-activation the GELU epilogues keep
// for the backward, which DGelu then reads. Accumulation is fp32 on the GPU (no TF32) and fp64 on the CPU. With beta == 0, C is
// not read (it may hold NaNs). GELU is the tanh approximation
//   0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#pragma once
#include "kernels/kernel.h"

namespace zp::kernels {

enum class GemmEpilogue : uint8_t { None, Bias, Gelu, BiasGelu, DGelu };

ZP_KERNEL(void gemm(StreamHandle s, DType ab_dt, DType c_dt, bool trans_a, bool trans_b, int64_t M,
                    int64_t N, int64_t K, float alpha, const void* A, int64_t lda, const void* B,
                    int64_t ldb, float beta, void* C, int64_t ldc,
                    GemmEpilogue ep = GemmEpilogue::None, const void* bias = nullptr,
                    void* aux = nullptr, int64_t batch = 1, int64_t stride_a = 0,
                    int64_t stride_b = 0, int64_t stride_c = 0, const void* c_in = nullptr))

// dbias[N] += column sums of dy[M,N] (dy contiguous, dtype dt; fp32 accumulation). Deterministic.
ZP_KERNEL(void bias_grad(StreamHandle s, DType dt, float* dbias, const void* dy, int64_t M, int64_t N))

}  // namespace zp::kernels
