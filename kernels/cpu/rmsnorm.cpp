#include "kernels/rmsnorm.h"

#include <cmath>
#include <vector>

namespace zp::kernels::cpu {

void rmsnorm_forward(StreamHandle, DType dt, void* y, float* rstd, const void* x, const void* weight, int64_t N,
                     int64_t C, float eps) {
  ZP_CHECK(N >= 0 && C > 0, "N=", N, " C=", C);
  ZP_CHECK(rstd && weight);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    auto* py = static_cast<T*>(y);
    auto* px = static_cast<const T*>(x);
    auto* w = static_cast<const T*>(weight);
    for (int64_t n = 0; n < N; ++n) {
      const T* xr = px + n * C;
      double ms = 0;
      for (int64_t c = 0; c < C; ++c) ms += double(xr[c]) * double(xr[c]);
      double r = 1.0 / std::sqrt(ms / double(C) + double(eps));
      for (int64_t c = 0; c < C; ++c) py[n * C + c] = T(double(xr[c]) * r * double(w[c]));
      rstd[n] = float(r);
    }
  });
}

// With xhat = x * rstd and g = dy * weight:  dx = rstd * (g - xhat * mean(g * xhat)),  dweight += dy * xhat.
void rmsnorm_backward(StreamHandle, DType dt, void* dx, float* dweight, const void* dy, const void* x,
                      const void* weight, const float* rstd, int64_t N, int64_t C, bool accumulate_dx) {
  ZP_CHECK(N >= 0 && C > 0, "N=", N, " C=", C);
  ZP_CHECK(dweight && weight && rstd);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    auto* pdx = static_cast<T*>(dx);
    auto* pdy = static_cast<const T*>(dy);
    auto* px = static_cast<const T*>(x);
    auto* w = static_cast<const T*>(weight);
    std::vector<double> dw(size_t(C), 0.0);
    for (int64_t n = 0; n < N; ++n) {
      double r = rstd[n];
      double gx_mean = 0;
      for (int64_t c = 0; c < C; ++c) {
        double xhat = double(px[n * C + c]) * r, d = double(pdy[n * C + c]);
        gx_mean += d * double(w[c]) * xhat;
        dw[size_t(c)] += d * xhat;
      }
      gx_mean /= double(C);
      for (int64_t c = 0; c < C; ++c) {
        double xhat = double(px[n * C + c]) * r;
        double v = r * (double(pdy[n * C + c]) * double(w[c]) - xhat * gx_mean);
        T& out = pdx[n * C + c];
        out = T(accumulate_dx ? double(out) + v : v);
      }
    }
    for (int64_t c = 0; c < C; ++c) dweight[c] = float(double(dweight[c]) + dw[size_t(c)]);
  });
}

}  // namespace zp::kernels::cpu
