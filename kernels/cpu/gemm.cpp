#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "kernels/gemm.h"

namespace zp::kernels::cpu {
namespace {

double gelu_tanh(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

double gelu_tanh_grad(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi), t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

template <class T, class TC>
void gemm_typed(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
                const T* A, int64_t lda, const T* B, int64_t ldb, double beta, TC* C, int64_t ldc,
                GemmEpilogue ep, const T* bias, TC* aux, const TC* c_in) {
  if (!c_in) c_in = C;
  auto a_at = [&](int64_t i, int64_t k) { return double(trans_a ? A[k * lda + i] : A[i * lda + k]); };
  const bool has_bias = ep == GemmEpilogue::Bias || ep == GemmEpilogue::BiasGelu;
  const bool has_gelu = ep == GemmEpilogue::Gelu || ep == GemmEpilogue::BiasGelu;
  std::vector<double> acc(static_cast<size_t>(N));
  for (int64_t i = 0; i < M; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0);
    if (!trans_b) {
      // i-k-j: the inner loop walks a row of B and the accumulator row contiguously.
      for (int64_t k = 0; k < K; ++k) {
        double a = a_at(i, k);
        const T* b = B + k * ldb;
        for (int64_t j = 0; j < N; ++j) acc[size_t(j)] += a * double(b[j]);
      }
    } else {
      // B is stored [N,K]: a dot product per output walks a row of B contiguously.
      for (int64_t j = 0; j < N; ++j) {
        const T* b = B + j * ldb;
        double sum = 0;
        for (int64_t k = 0; k < K; ++k) sum += a_at(i, k) * double(b[k]);
        acc[size_t(j)] = sum;
      }
    }
    for (int64_t j = 0; j < N; ++j) {
      double pre = alpha * acc[size_t(j)];
      if (beta != 0) pre += beta * double(c_in[i * ldc + j]);
      if (has_bias) pre += double(bias[j]);
      if (ep == GemmEpilogue::DGelu) {
        C[i * ldc + j] = TC(pre * gelu_tanh_grad(double(aux[i * N + j])));
        continue;
      }
      if (has_gelu && aux) aux[i * N + j] = TC(pre);
      C[i * ldc + j] = TC(has_gelu ? gelu_tanh(pre) : pre);
    }
  }
}

template <class T, class TC>
void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
                  int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc,
                  GemmEpilogue ep, const void* bias, void* aux, int64_t batch, int64_t stride_a,
                  int64_t stride_b, int64_t stride_c, const void* c_in) {
  for (int64_t b = 0; b < batch; ++b)
    gemm_typed<T, TC>(trans_a, trans_b, M, N, K, alpha, static_cast<const T*>(A) + b * stride_a, lda,
                      static_cast<const T*>(B) + b * stride_b, ldb, beta, static_cast<TC*>(C) + b * stride_c,
                      ldc, ep, static_cast<const T*>(bias), aux ? static_cast<TC*>(aux) + b * M * N : nullptr,
                      c_in ? static_cast<const TC*>(c_in) + b * stride_c : nullptr);
}

}  // namespace

void gemm(StreamHandle, DType ab_dt, DType c_dt, bool trans_a, bool trans_b, int64_t M, int64_t N,
          int64_t K, float alpha, const void* A, int64_t lda, const void* B, int64_t ldb, float beta,
          void* C, int64_t ldc, GemmEpilogue ep, const void* bias, void* aux, int64_t batch,
          int64_t stride_a, int64_t stride_b, int64_t stride_c, const void* c_in) {
  ZP_CHECK(M >= 0 && N >= 0 && K >= 0 && batch >= 0, "M=", M, " N=", N, " K=", K, " batch=", batch);
  ZP_CHECK(lda >= std::max<int64_t>(1, trans_a ? M : K), "lda=", lda);
  ZP_CHECK(ldb >= std::max<int64_t>(1, trans_b ? K : N), "ldb=", ldb);
  ZP_CHECK(ldc >= std::max<int64_t>(1, N), "ldc=", ldc);
  ZP_CHECK(c_dt == ab_dt || c_dt == DType::F32, "C must be ", dtype_name(ab_dt), " or f32, got ",
           dtype_name(c_dt));
  const bool has_bias = ep == GemmEpilogue::Bias || ep == GemmEpilogue::BiasGelu;
  ZP_CHECK(!has_bias || bias != nullptr, "bias epilogue without a bias");
  ZP_CHECK(aux == nullptr || ep == GemmEpilogue::Gelu || ep == GemmEpilogue::BiasGelu || ep == GemmEpilogue::DGelu,
           "aux is only written by the GELU epilogues or read by DGelu");
  ZP_CHECK(ep != GemmEpilogue::DGelu || (aux != nullptr && beta == 0.f),
           "the DGelu epilogue reads the pre-activation from aux and takes beta = 0");
  ZP_DISPATCH_FLOAT(ab_dt, T, [&] {
    if (c_dt == ab_dt)
      gemm_batched<T, T>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ep, bias, aux,
                         batch, stride_a, stride_b, stride_c, c_in);
    else
      gemm_batched<T, float>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ep, bias,
                             aux, batch, stride_a, stride_b, stride_c, c_in);
  });
}

void bias_grad(StreamHandle, DType dt, float* dbias, const void* dy, int64_t M, int64_t N) {
  ZP_CHECK(M >= 0 && N >= 0, "M=", M, " N=", N);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    std::vector<double> sum(static_cast<size_t>(N), 0.0);
    const T* y = static_cast<const T*>(dy);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) sum[size_t(j)] += double(y[i * N + j]);
    for (int64_t j = 0; j < N; ++j) dbias[j] = float(double(dbias[j]) + sum[size_t(j)]);
  });
}

}  // namespace zp::kernels::cpu
