#include "kernels/nhwc.h"

namespace zp::kernels::cpu {

void transpose_batched(StreamHandle, DType dt, void* y, const void* x, int64_t B, int64_t P, int64_t Q) {
  ZP_CHECK(B >= 0 && P >= 0 && Q >= 0, "B=", B, " P=", P, " Q=", Q);
  ZP_CHECK(y != x || B * P * Q == 0, "transpose_batched is out of place");
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    for (int64_t b = 0; b < B; ++b) {
      const T* xb = static_cast<const T*>(x) + b * P * Q;
      T* yb = static_cast<T*>(y) + b * P * Q;
      for (int64_t p = 0; p < P; ++p)
        for (int64_t q = 0; q < Q; ++q) yb[q * P + p] = xb[p * Q + q];
    }
  });
}

void channel_add(StreamHandle, DType dt, void* y, const void* shift, int64_t N, int64_t C, int64_t HW) {
  ZP_CHECK(N >= 0 && C >= 0 && HW >= 0, "N=", N, " C=", C, " HW=", HW);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) {
        const T* s = static_cast<const T*>(shift) + n * C;
        T* row = static_cast<T*>(y) + (n * HW + i) * C;
        for (int64_t c = 0; c < C; ++c) row[c] = T(double(row[c]) + double(s[c]));
      }
  });
}

void channel_sum(StreamHandle, DType dt, void* sum, const void* x, int64_t N, int64_t C, int64_t HW) {
  ZP_CHECK(N >= 0 && C >= 0 && HW >= 0, "N=", N, " C=", C, " HW=", HW);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) {
        double acc = 0;
        for (int64_t i = 0; i < HW; ++i) acc += double(static_cast<const T*>(x)[(n * HW + i) * C + c]);
        static_cast<T*>(sum)[n * C + c] = T(acc);
      }
  });
}

}  // namespace zp::kernels::cpu
