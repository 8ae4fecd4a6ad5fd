#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/softmax.h"

namespace zp::kernels::cpu {

void softmax_forward(StreamHandle, DType dt, void* y, const void* x, int64_t N, int64_t C, float scale,
                     int64_t causal_T) {
  ZP_CHECK(N >= 0 && C > 0 && causal_T >= 0);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    std::vector<double> row(size_t(C), 0.0);
    for (int64_t r = 0; r < N; ++r) {
      const T* xr = static_cast<const T*>(x) + r * C;
      T* yr = static_cast<T*>(y) + r * C;
      int64_t visible = causal_T > 0 ? std::min(C, r % causal_T + 1) : C;
      double mx = -INFINITY;
      for (int64_t c = 0; c < visible; ++c) mx = std::max(mx, double(scale) * double(xr[c]));
      double sum = 0;
      for (int64_t c = 0; c < visible; ++c) sum += row[size_t(c)] = std::exp(double(scale) * double(xr[c]) - mx);
      for (int64_t c = 0; c < C; ++c) yr[c] = T(c < visible ? row[size_t(c)] / sum : 0.0);
    }
  });
}

void softmax_backward(StreamHandle, DType dt, void* dx, const void* dy, const void* y, int64_t N, int64_t C,
                      float scale) {
  ZP_CHECK(N >= 0 && C > 0);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    for (int64_t r = 0; r < N; ++r) {
      const T* yr = static_cast<const T*>(y) + r * C;
      const T* dyr = static_cast<const T*>(dy) + r * C;
      T* dxr = static_cast<T*>(dx) + r * C;
      double dot = 0;
      for (int64_t c = 0; c < C; ++c) dot += double(dyr[c]) * double(yr[c]);
      for (int64_t c = 0; c < C; ++c) dxr[c] = T(double(scale) * double(yr[c]) * (double(dyr[c]) - dot));
    }
  });
}

}  // namespace zp::kernels::cpu
