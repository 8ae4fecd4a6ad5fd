#include <cmath>

#include "kernels/cross_entropy.h"

namespace zp::kernels::cpu {
namespace {

template <class T>
double row_logsumexp(const T* x, int64_t V) {
  double mx = -INFINITY;
  for (int64_t c = 0; c < V; ++c) mx = std::max(mx, double(x[c]));
  double sum = 0;
  for (int64_t c = 0; c < V; ++c) sum += std::exp(double(x[c]) - mx);
  return mx + std::log(sum);
}

}  // namespace

void cross_entropy_forward(StreamHandle, DType dt, float* losses, float* lse, const void* logits,
                           const int32_t* targets, int64_t N, int64_t V, int64_t ld) {
  ZP_CHECK(N >= 0 && V > 0 && ld >= V);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    for (int64_t n = 0; n < N; ++n) {
      const T* x = static_cast<const T*>(logits) + n * ld;
      int32_t t = targets[n];
      ZP_CHECK(t < V, "target ", t, " out of range for vocabulary ", V);
      if (t < 0) {
        losses[n] = 0.f;
        if (lse) lse[n] = 0.f;
        continue;
      }
      double l = row_logsumexp(x, V);
      losses[n] = float(l - double(x[t]));
      if (lse) lse[n] = float(l);
    }
  });
}

// The reference recomputes the logsumexp in double rather than trusting the fp32 `lse`.
void cross_entropy_backward(StreamHandle, DType dt, void* dlogits, const void* logits, const float* lse,
                            const int32_t* targets, float dloss_scale, int64_t N, int64_t V, int64_t ld) {
  ZP_CHECK(N >= 0 && V > 0 && ld >= V);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    for (int64_t n = 0; n < N; ++n) {
      const T* x = static_cast<const T*>(logits) + n * ld;
      T* dx = static_cast<T*>(dlogits) + n * ld;
      int32_t t = targets[n];
      ZP_CHECK(t < V, "target ", t, " out of range for vocabulary ", V);
      if (t < 0) {
        for (int64_t c = 0; c < ld; ++c) dx[c] = T(0.0);
        continue;
      }
      double l = row_logsumexp(x, V);
      for (int64_t c = 0; c < V; ++c)  // reads x[c] before writing dx[c]: in place is fine
        dx[c] = T(double(dloss_scale) * (std::exp(double(x[c]) - l) - (c == t ? 1.0 : 0.0)));
      for (int64_t c = V; c < ld; ++c) dx[c] = T(0.0);
    }
  });
}

}  // namespace zp::kernels::cpu
