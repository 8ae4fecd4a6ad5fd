#include "kernels/row_linear.h"

#include <cmath>
#include <cstdint>
#include <vector>

namespace zp::kernels::cpu {

void row_linear(StreamHandle, DType dt, RowInput in, RowOutput out, int64_t M, int64_t N, int64_t K, const void* x,
                int64_t ldx, const void* norm_weight, float eps, const void* w, int64_t ldw, const void* bias, void* y,
                int64_t ldy, const void* residual, const RowRopeCache* rope) {
  ZP_CHECK(M >= 0 && N >= 0 && K > 0, "row_linear: M=", M, " N=", N, " K=", K);
  ZP_CHECK(ldx >= K && ldw >= K && ldy >= N, "row_linear: ldx=", ldx, " ldw=", ldw, " ldy=", ldy);
  ZP_CHECK(in != RowInput::RmsNorm || norm_weight, "row_linear: RmsNorm without a norm weight");
  ZP_CHECK(out == RowOutput::Plain || !residual, "row_linear: a SwiGLU or RoPE + cache output takes no residual");
  row_rope_cache_check(out, N, rope);
  // RopeCache: the angles as rope_forward's reference takes them (float32 inverse frequencies and angle).
  std::vector<float> inv_freq;
  if (out == RowOutput::RopeCache)
    for (int64_t i = 0; i < rope->D / 2; ++i)
      inv_freq.push_back(1.0f / std::pow(rope->theta, float(2 * i) / float(rope->D)));
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
        const int64_t D = rope->D, half = D / 2, Hq = rope->Hq, Hkv = rope->Hkv;
        const int32_t slot = rope->slots[m];
        for (int64_t h = 0; h < Hq + 2 * Hkv; ++h) {
          for (int64_t i = 0; i < half; ++i) {
            double y1 = product(h * D + i), y2 = product(h * D + i + half);
            if (h < Hq + Hkv) {
              const float a = float(rope->positions[m]) * inv_freq[size_t(i)];
              const double c = double(float(std::cos(double(a)))), sn = double(float(std::sin(double(a))));
              const double x1 = y1, x2 = y2;
              y1 = x1 * c - x2 * sn;
              y2 = x2 * c + x1 * sn;
            }
            py[m * ldy + h * D + i] = T(y1);
            py[m * ldy + h * D + i + half] = T(y2);
            if (h >= Hq && slot >= 0) {
              T* cache = static_cast<T*>(h < Hq + Hkv ? rope->k_cache : rope->v_cache);
              T* at = cache + (int64_t(slot) * Hkv + (h < Hq + Hkv ? h - Hq : h - Hq - Hkv)) * D + i;
              at[0] = T(y1);
              at[half] = T(y2);
            }
          }
        }
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
