#include "kernels/row_linear.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/paged_attention.h"
#include "kernels/rope.h"

namespace zp::kernels::cpu {

void row_linear(StreamHandle, DType dt, RowInput in, RowOutput out, int64_t M, int64_t N, int64_t K, const void* x,
                int64_t ldx, const void* norm_weight, float eps, const void* w, int64_t ldw, const void* bias, void* y,
                int64_t ldy, const void* residual, const RowRopeCache* rope) {
  ZP_CHECK(M >= 0 && N >= 0 && K > 0, "row_linear: M=", M, " N=", N, " K=", K);
  ZP_CHECK(ldx >= K && ldw >= K && ldy >= N, "row_linear: ldx=", ldx, " ldw=", ldw, " ldy=", ldy);
  ZP_CHECK(in != RowInput::RmsNorm || norm_weight, "row_linear: RmsNorm without a norm weight");
  ZP_CHECK(out == RowOutput::Plain || !residual, "row_linear: a SwiGLU or RoPE + cache output takes no residual");
  row_rope_cache_check(out, N, rope);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    auto* px = static_cast<const T*>(x);
    auto* pw = static_cast<const T*>(w);
    auto* pb = static_cast<const T*>(bias);
    auto* pr = static_cast<const T*>(residual);
    auto* py = static_cast<T*>(y);
    auto* nw = static_cast<const T*>(norm_weight);
    std::vector<double> f(static_cast<size_t>(K));
    for (int64_t m = 0; m < M; ++m) {
      const T* xr = px + m * ldx;
      double r = 1.0;
      if (in == RowInput::RmsNorm) {
        double ms = 0;
        for (int64_t k = 0; k < K; ++k) ms += double(xr[k]) * double(xr[k]);
        r = 1.0 / std::sqrt(ms / double(K) + double(eps));
      }
      for (int64_t k = 0; k < K; ++k) {
        const double v = double(xr[k]);
        f[size_t(k)] = in == RowInput::RmsNorm ? v * r * double(nw[k]) : v;
      }
      auto product = [&](int64_t row) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += f[size_t(k)] * double(pw[row * ldw + k]);
        return pb ? acc + double(pb[row]) : acc;
      };
      if (out == RowOutput::RopeCache) {
        // The row's sums unrounded, rotated by rope_forward's reference, rounded once; then k and v
        // stored by kv_cache_write's.
        const int64_t Hq = rope->Hq, Hkv = rope->Hkv, D = rope->D;
        std::vector<double> row(static_cast<size_t>(N));
        for (int64_t n = 0; n < N; ++n) row[size_t(n)] = product(n);
        rope_forward(nullptr, DType::F64, row.data(), row.data(), 1, 1, Hq + Hkv, D, rope->theta, 0, N,
                     rope->positions + m);
        T* yr = py + m * ldy;
        for (int64_t n = 0; n < N; ++n) yr[n] = T(row[size_t(n)]);
        kv_cache_write(nullptr, dt, rope->k_cache, rope->v_cache, yr + Hq * D, yr + (Hq + Hkv) * D, 1, Hkv, D, ldy,
                       ldy, rope->slots + m, 1);
        continue;
      }
      for (int64_t n = 0; n < N; ++n) {
        double v;
        if (out == RowOutput::SwiGLU) {
          const double g = product(n), u = product(N + n);
          v = g / (1.0 + std::exp(-g)) * u;
        } else {
          v = product(n);
          if (pr) v += double(pr[m * ldy + n]);
        }
        py[m * ldy + n] = T(v);
      }
    }
  });
}

}  // namespace zp::kernels::cpu

namespace zp::kernels {

void row_rope_cache_check(RowOutput out, int64_t N, const RowRopeCache* rope) {
  if (out != RowOutput::RopeCache) return;
  ZP_CHECK(rope, "row_linear: a RoPE + cache output without its RowRopeCache");
  ZP_CHECK(rope->Hq > 0 && rope->Hkv > 0 && rope->D > 0 && rope->D % 2 == 0 && rope->D <= 1024 && rope->theta > 0,
           "row_linear: RoPE + cache output with Hq=", rope->Hq, " Hkv=", rope->Hkv, " D=", rope->D,
           " theta=", rope->theta);
  ZP_CHECK(N == (rope->Hq + 2 * rope->Hkv) * rope->D, "row_linear: a RoPE + cache output has (Hq + 2 Hkv) D = ",
           (rope->Hq + 2 * rope->Hkv) * rope->D, " outputs, not ", N);
  ZP_CHECK(rope->positions && rope->slots && rope->k_cache && rope->v_cache,
           "row_linear: RoPE + cache output without positions, slots or caches");
}

bool row_linear_fits(DType dt, int64_t M, int64_t K, int64_t ldx, const void* x, int64_t ldw, const void* w,
                     const void* norm_weight) {
  if (dt != DType::BF16 && dt != DType::F16) return false;
  if (M < 1 || M > kRowLinearMaxRows || K < 8 || K > INT32_MAX || K % 8 != 0 || ldx % 8 != 0 || ldw % 8 != 0)
    return false;
  for (const void* p : {x, w, norm_weight})
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;  // nullptr passes
  return true;
}

namespace {
thread_local bool constant_weights = false;
}  // namespace

ConstantWeightsScope::ConstantWeightsScope(bool on) : was_(constant_weights) { constant_weights = was_ || on; }
ConstantWeightsScope::~ConstantWeightsScope() { constant_weights = was_; }
bool ConstantWeightsScope::active() { return constant_weights; }

}  // namespace zp::kernels
