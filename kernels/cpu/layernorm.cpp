#include "kernels/layernorm.h"

#include <cmath>
#include <vector>

namespace zp::kernels::cpu {

void layernorm_forward(StreamHandle, DType dt, void* y, float* mean, float* rstd, const void* x, const void* weight,
                       const void* bias, int64_t N, int64_t C, float eps) {
  ZP_CHECK(N >= 0 && C > 0, "N=", N, " C=", C);
  ZP_CHECK(mean && rstd && weight);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    auto* py = static_cast<T*>(y);
    auto* px = static_cast<const T*>(x);
    auto* w = static_cast<const T*>(weight);
    auto* b = static_cast<const T*>(bias);
    for (int64_t n = 0; n < N; ++n) {
      const T* xr = px + n * C;
      double m = 0;
      for (int64_t c = 0; c < C; ++c) m += double(xr[c]);
      m /= double(C);
      double var = 0;
      for (int64_t c = 0; c < C; ++c) var += (double(xr[c]) - m) * (double(xr[c]) - m);
      double r = 1.0 / std::sqrt(var / double(C) + double(eps));
      for (int64_t c = 0; c < C; ++c)
        py[n * C + c] = T((double(xr[c]) - m) * r * double(w[c]) + (b ? double(b[c]) : 0.0));
      mean[n] = float(m);
      rstd[n] = float(r);
    }
  });
}

// With xhat = (x - mean) * rstd and g = dy * weight:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dweight += dy * xhat,  dbias += dy.
void layernorm_backward(StreamHandle, DType dt, void* dx, float* dweight, float* dbias, const void* dy, const void* x,
                        const void* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                        bool accumulate_dx) {
  ZP_CHECK(N >= 0 && C > 0, "N=", N, " C=", C);
  ZP_CHECK(dweight && weight && mean && rstd);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    auto* pdx = static_cast<T*>(dx);
    auto* pdy = static_cast<const T*>(dy);
    auto* px = static_cast<const T*>(x);
    auto* w = static_cast<const T*>(weight);
    std::vector<double> dw(size_t(C), 0.0), db(size_t(C), 0.0);
    for (int64_t n = 0; n < N; ++n) {
      double m = mean[n], r = rstd[n];
      double g_mean = 0, gx_mean = 0;
      for (int64_t c = 0; c < C; ++c) {
        double xhat = (double(px[n * C + c]) - m) * r, d = double(pdy[n * C + c]);
        double g = d * double(w[c]);
        g_mean += g;
        gx_mean += g * xhat;
        dw[size_t(c)] += d * xhat;
        db[size_t(c)] += d;
      }
      g_mean /= double(C);
      gx_mean /= double(C);
      for (int64_t c = 0; c < C; ++c) {
        double xhat = (double(px[n * C + c]) - m) * r;
        double g = double(pdy[n * C + c]) * double(w[c]);
        double v = r * (g - g_mean - xhat * gx_mean);
        T& out = pdx[n * C + c];
        out = T(accumulate_dx ? double(out) + v : v);
      }
    }
    for (int64_t c = 0; c < C; ++c) {
      dweight[c] = float(double(dweight[c]) + dw[size_t(c)]);
      if (dbias) dbias[c] = float(double(dbias[c]) + db[size_t(c)]);
    }
  });
}

}  // namespace zp::kernels::cpu
