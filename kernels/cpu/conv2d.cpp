#include <vector>

#include "kernels/conv2d.h"

namespace zp::kernels::cpu {
namespace {

void check_shape(const Conv2dShape& c) {
  ZP_CHECK(c.N > 0 && c.Cin > 0 && c.H > 0 && c.W > 0 && c.Cout > 0 && c.KH > 0 && c.KW > 0);
  ZP_CHECK(c.stride_h > 0 && c.stride_w > 0 && c.pad_h >= 0 && c.pad_w >= 0);
  ZP_CHECK(c.oh() > 0 && c.ow() > 0, "kernel larger than the padded input");
}

template <class T> std::vector<double> to_double(const void* p, int64_t n) {
  auto* t = static_cast<const T*>(p);
  return std::vector<double>(t, t + n);  // T converts to float/double implicitly
}

// Visits every (input pixel, output pixel, weight tap) triple of one (n, co, ci) plane pair:
// f(x_index_in_plane, y_index_in_plane, w_index_in_kernel).
template <class F> void for_each_tap(const Conv2dShape& c, F&& f) {
  const int64_t OH = c.oh(), OW = c.ow();
  for (int64_t kh = 0; kh < c.KH; ++kh)
    for (int64_t kw = 0; kw < c.KW; ++kw)
      for (int64_t oh = 0; oh < OH; ++oh) {
        int64_t ih = oh * c.stride_h - c.pad_h + kh;
        if (ih < 0 || ih >= c.H) continue;
        for (int64_t ow = 0; ow < OW; ++ow) {
          int64_t iw = ow * c.stride_w - c.pad_w + kw;
          if (iw < 0 || iw >= c.W) continue;
          f(ih * c.W + iw, oh * OW + ow, kh * c.KW + kw);
        }
      }
}

}  // namespace

void conv2d_forward(StreamHandle, DType dt, void* y, const void* x, const void* w, const void* bias,
                    const Conv2dShape& c) {
  check_shape(c);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    auto xd = to_double<T>(x, c.x_numel()), wd = to_double<T>(w, c.w_numel());
    const int64_t HW = c.H * c.W, OHW = c.oh() * c.ow(), K = c.KH * c.KW;
    std::vector<double> acc(static_cast<size_t>(OHW));
    for (int64_t n = 0; n < c.N; ++n)
      for (int64_t co = 0; co < c.Cout; ++co) {
        double b = bias ? double(static_cast<const T*>(bias)[co]) : 0.0;
        std::fill(acc.begin(), acc.end(), b);
        for (int64_t ci = 0; ci < c.Cin; ++ci) {
          const double* xp = &xd[size_t((n * c.Cin + ci) * HW)];
          const double* wp = &wd[size_t((co * c.Cin + ci) * K)];
          for_each_tap(c, [&](int64_t xi, int64_t yi, int64_t wi) { acc[size_t(yi)] += xp[xi] * wp[wi]; });
        }
        T* yp = static_cast<T*>(y) + (n * c.Cout + co) * OHW;
        for (int64_t i = 0; i < OHW; ++i) yp[i] = T(acc[size_t(i)]);
      }
  });
}

void conv2d_backward_data(StreamHandle, DType dt, void* dx, const void* dy, const void* w, const Conv2dShape& c) {
  check_shape(c);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    auto dyd = to_double<T>(dy, c.y_numel()), wd = to_double<T>(w, c.w_numel());
    const int64_t HW = c.H * c.W, OHW = c.oh() * c.ow(), K = c.KH * c.KW;
    std::vector<double> acc(static_cast<size_t>(HW));
    for (int64_t n = 0; n < c.N; ++n)
      for (int64_t ci = 0; ci < c.Cin; ++ci) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t co = 0; co < c.Cout; ++co) {
          const double* dyp = &dyd[size_t((n * c.Cout + co) * OHW)];
          const double* wp = &wd[size_t((co * c.Cin + ci) * K)];
          for_each_tap(c, [&](int64_t xi, int64_t yi, int64_t wi) { acc[size_t(xi)] += dyp[yi] * wp[wi]; });
        }
        T* dxp = static_cast<T*>(dx) + (n * c.Cin + ci) * HW;
        for (int64_t i = 0; i < HW; ++i) dxp[i] = T(acc[size_t(i)]);
      }
  });
}

void conv2d_backward_filter(StreamHandle, DType dt, float* dw, float* dbias, const void* dy, const void* x,
                            const Conv2dShape& c) {
  check_shape(c);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    auto dyd = to_double<T>(dy, c.y_numel()), xd = to_double<T>(x, c.x_numel());
    const int64_t HW = c.H * c.W, OHW = c.oh() * c.ow(), K = c.KH * c.KW;
    std::vector<double> acc(static_cast<size_t>(K));
    for (int64_t co = 0; co < c.Cout; ++co) {
      for (int64_t ci = 0; ci < c.Cin; ++ci) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t n = 0; n < c.N; ++n) {
          const double* dyp = &dyd[size_t((n * c.Cout + co) * OHW)];
          const double* xp = &xd[size_t((n * c.Cin + ci) * HW)];
          for_each_tap(c, [&](int64_t xi, int64_t yi, int64_t wi) { acc[size_t(wi)] += dyp[yi] * xp[xi]; });
        }
        float* dwp = dw + (co * c.Cin + ci) * K;
        for (int64_t k = 0; k < K; ++k) dwp[k] = float(double(dwp[k]) + acc[size_t(k)]);
      }
      if (dbias) {
        double sum = 0;
        for (int64_t n = 0; n < c.N; ++n)
          for (int64_t i = 0; i < OHW; ++i) sum += dyd[size_t((n * c.Cout + co) * OHW + i)];
        dbias[co] = float(double(dbias[co]) + sum);
      }
    }
  });
}

}  // namespace zp::kernels::cpu
