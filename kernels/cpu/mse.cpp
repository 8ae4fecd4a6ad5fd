#include "kernels/mse.h"

namespace zp::kernels::cpu {

void mse_forward(StreamHandle, DType dt, float* losses, const void* pred, const float* target, const float* weight,
                 int64_t B, int64_t n) {
  ZP_CHECK(B >= 0 && n > 0, "mse_forward B=", B, " n=", n);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    const T* p = static_cast<const T*>(pred);
    for (int64_t b = 0; b < B; ++b) {
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double d = double(p[b * n + i]) - double(target[b * n + i]);
        sum += d * d;
      }
      losses[b] = float((weight ? double(weight[b]) : 1.0) * sum / double(n));
    }
  });
}

void mse_backward(StreamHandle, DType dt, void* dpred, const void* pred, const float* target, const float* weight,
                  float scale, int64_t B, int64_t n) {
  ZP_CHECK(B >= 0 && n > 0, "mse_backward B=", B, " n=", n);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    const T* p = static_cast<const T*>(pred);
    T* d = static_cast<T*>(dpred);
    for (int64_t b = 0; b < B; ++b) {
      const double c = 2.0 * double(scale) * (weight ? double(weight[b]) : 1.0) / (double(B) * double(n));
      for (int64_t i = 0; i < n; ++i) d[b * n + i] = T(c * (double(p[b * n + i]) - double(target[b * n + i])));
    }
  });
}

}  // namespace zp::kernels::cpu
