#include <algorithm>
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
  return std::vector<double>(t, t + n);
}

// The weight [Cout, Cin, KH, KW] as [KH, KW, A, B] with (A, B) = (Cout, Cin), or (Cin, Cout) when
// `in_major`: each tap's matrix then has the channel that an inner loop runs over contiguous.
template <class T> std::vector<double> taps(const void* w, const Conv2dShape& c, bool in_major) {
  const T* pw = static_cast<const T*>(w);
  std::vector<double> t(size_t(c.w_numel()));
  for (int64_t co = 0; co < c.Cout; ++co)
    for (int64_t ci = 0; ci < c.Cin; ++ci)
      for (int64_t k = 0; k < c.KH * c.KW; ++k) {
        const int64_t inner = in_major ? ci * c.Cout + co : co * c.Cin + ci;
        t[size_t(k * c.Cin * c.Cout + inner)] = double(pw[(co * c.Cin + ci) * c.KH * c.KW + k]);
      }
  return t;
}

// Calls f(input pixel, output pixel, tap) for every (output pixel, tap) whose input is inside the image.
template <class F> void for_each_tap(const Conv2dShape& c, F&& f) {
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t oh = 0; oh < c.oh(); ++oh)
      for (int64_t ow = 0; ow < c.ow(); ++ow)
        for (int64_t kh = 0; kh < c.KH; ++kh) {
          const int64_t ih = oh * c.stride_h - c.pad_h + kh;
          if (ih < 0 || ih >= c.H) continue;
          for (int64_t kw = 0; kw < c.KW; ++kw) {
            const int64_t iw = ow * c.stride_w - c.pad_w + kw;
            if (iw < 0 || iw >= c.W) continue;
            f((n * c.H + ih) * c.W + iw, (n * c.oh() + oh) * c.ow() + ow, kh * c.KW + kw);
          }
        }
}

}  // namespace

void conv2d_forward(StreamHandle, DType dt, void* y, const void* x, const void* w, const void* bias,
                    const Conv2dShape& c) {
  check_shape(c);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    const auto xd = to_double<T>(x, c.x_numel()), wt = taps<T>(w, c, false);
    const int64_t Ci = c.Cin, Co = c.Cout, pixels = c.N * c.oh() * c.ow();
    std::vector<double> acc(size_t(pixels * Co));
    const T* pb = static_cast<const T*>(bias);
    for (int64_t p = 0; p < pixels; ++p)
      for (int64_t co = 0; co < Co; ++co) acc[size_t(p * Co + co)] = pb ? double(pb[co]) : 0.0;
    for_each_tap(c, [&](int64_t in, int64_t out, int64_t k) {
      const double* xp = &xd[size_t(in * Ci)];
      double* yp = &acc[size_t(out * Co)];
      for (int64_t co = 0; co < Co; ++co) {
        const double* wp = &wt[size_t((k * Co + co) * Ci)];
        double s = 0;
        for (int64_t ci = 0; ci < Ci; ++ci) s += wp[ci] * xp[ci];
        yp[co] += s;
      }
    });
    T* py = static_cast<T*>(y);
    for (size_t i = 0; i < acc.size(); ++i) py[i] = T(acc[i]);
  });
}

void conv2d_backward_data(StreamHandle, DType dt, void* dx, const void* dy, const void* w, const Conv2dShape& c) {
  check_shape(c);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    const auto dyd = to_double<T>(dy, c.y_numel()), wt = taps<T>(w, c, true);
    const int64_t Ci = c.Cin, Co = c.Cout;
    std::vector<double> acc(size_t(c.x_numel()), 0.0);
    for_each_tap(c, [&](int64_t in, int64_t out, int64_t k) {
      const double* gp = &dyd[size_t(out * Co)];
      double* xp = &acc[size_t(in * Ci)];
      for (int64_t ci = 0; ci < Ci; ++ci) {
        const double* wp = &wt[size_t((k * Ci + ci) * Co)];
        double s = 0;
        for (int64_t co = 0; co < Co; ++co) s += wp[co] * gp[co];
        xp[ci] += s;
      }
    });
    T* pdx = static_cast<T*>(dx);
    for (size_t i = 0; i < acc.size(); ++i) pdx[i] = T(acc[i]);
  });
}

void conv2d_backward_filter(StreamHandle, DType dt, float* dw, float* dbias, const void* dy, const void* x,
                            const Conv2dShape& c) {
  check_shape(c);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    const auto dyd = to_double<T>(dy, c.y_numel()), xd = to_double<T>(x, c.x_numel());
    const int64_t Ci = c.Cin, Co = c.Cout, K = c.KH * c.KW;
    std::vector<double> g(size_t(c.w_numel()), 0.0);  // [K, Cout, Cin]
    for_each_tap(c, [&](int64_t in, int64_t out, int64_t k) {
      const double* xp = &xd[size_t(in * Ci)];
      const double* gp = &dyd[size_t(out * Co)];
      for (int64_t co = 0; co < Co; ++co) {
        double* wp = &g[size_t((k * Co + co) * Ci)];
        const double d = gp[co];
        for (int64_t ci = 0; ci < Ci; ++ci) wp[ci] += d * xp[ci];
      }
    });
    for (int64_t co = 0; co < Co; ++co)
      for (int64_t ci = 0; ci < Ci; ++ci)
        for (int64_t k = 0; k < K; ++k) {
          float& v = dw[(co * Ci + ci) * K + k];
          v = float(double(v) + g[size_t((k * Co + co) * Ci + ci)]);
        }
    if (dbias) {
      const int64_t pixels = c.N * c.oh() * c.ow();
      for (int64_t co = 0; co < Co; ++co) {
        double sum = 0;
        for (int64_t p = 0; p < pixels; ++p) sum += dyd[size_t(p * Co + co)];
        dbias[co] = float(double(dbias[co]) + sum);
      }
    }
  });
}

}  // namespace zp::kernels::cpu
