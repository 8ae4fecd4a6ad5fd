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

// Output positions [lo, hi) along one axis whose input position o * stride - pad + k is inside [0, in).
struct Range {
  int64_t lo, hi;
};
Range valid_outputs(int64_t k, int64_t pad, int64_t stride, int64_t in, int64_t out) {
  int64_t lo = 0, hi = out;
  while (lo < hi && lo * stride - pad + k < 0) ++lo;
  while (hi > lo && (hi - 1) * stride - pad + k >= in) --hi;
  return {lo, hi};
}

// Calls f(x_row, y_row, ow_range) for every output row of kernel tap (kh, kw): x_row points at the
// input element that output column 0 of that row would read (x_row[ow * stride_w] for ow in range),
// y_row at the output row. Loops inside f run over contiguous outputs, which the compiler vectorises.
template <class F> void for_each_row(const Conv2dShape& c, int64_t kh, int64_t kw, F&& f) {
  const Range rh = valid_outputs(kh, c.pad_h, c.stride_h, c.H, c.oh());
  const Range rw = valid_outputs(kw, c.pad_w, c.stride_w, c.W, c.ow());
  for (int64_t oh = rh.lo; oh < rh.hi; ++oh) {
    const int64_t ih = oh * c.stride_h - c.pad_h + kh;
    f(ih * c.W - c.pad_w + kw, oh * c.ow(), rw);
  }
}

}  // namespace

void conv2d_forward(StreamHandle, DType dt, void* y, const void* x, const void* w, const void* bias,
                    const Conv2dShape& c) {
  check_shape(c);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    const auto xd = to_double<T>(x, c.x_numel()), wd = to_double<T>(w, c.w_numel());
    const int64_t HW = c.H * c.W, OHW = c.oh() * c.ow(), sw = c.stride_w;
    std::vector<double> acc(static_cast<size_t>(OHW));
    for (int64_t n = 0; n < c.N; ++n)
      for (int64_t co = 0; co < c.Cout; ++co) {
        std::fill(acc.begin(), acc.end(), bias ? double(static_cast<const T*>(bias)[co]) : 0.0);
        for (int64_t ci = 0; ci < c.Cin; ++ci)
          for (int64_t kh = 0; kh < c.KH; ++kh)
            for (int64_t kw = 0; kw < c.KW; ++kw) {
              const double wv = wd[size_t(((co * c.Cin + ci) * c.KH + kh) * c.KW + kw)];
              const double* xp = &xd[size_t((n * c.Cin + ci) * HW)];
              for_each_row(c, kh, kw, [&](int64_t xi, int64_t yi, Range r) {
                double* __restrict out = acc.data() + yi;
                const double* __restrict in = xp + xi;
                for (int64_t ow = r.lo; ow < r.hi; ++ow) out[ow] += wv * in[ow * sw];
              });
            }
        T* yp = static_cast<T*>(y) + (n * c.Cout + co) * OHW;
        for (int64_t i = 0; i < OHW; ++i) yp[i] = T(acc[size_t(i)]);
      }
  });
}

void conv2d_backward_data(StreamHandle, DType dt, void* dx, const void* dy, const void* w, const Conv2dShape& c) {
  check_shape(c);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    const auto dyd = to_double<T>(dy, c.y_numel()), wd = to_double<T>(w, c.w_numel());
    const int64_t HW = c.H * c.W, OHW = c.oh() * c.ow(), sw = c.stride_w;
    std::vector<double> acc(static_cast<size_t>(HW));
    for (int64_t n = 0; n < c.N; ++n)
      for (int64_t ci = 0; ci < c.Cin; ++ci) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t co = 0; co < c.Cout; ++co)
          for (int64_t kh = 0; kh < c.KH; ++kh)
            for (int64_t kw = 0; kw < c.KW; ++kw) {
              const double wv = wd[size_t(((co * c.Cin + ci) * c.KH + kh) * c.KW + kw)];
              const double* dyp = &dyd[size_t((n * c.Cout + co) * OHW)];
              for_each_row(c, kh, kw, [&](int64_t xi, int64_t yi, Range r) {
                double* __restrict out = acc.data() + xi;
                const double* __restrict in = dyp + yi;
                for (int64_t ow = r.lo; ow < r.hi; ++ow) out[ow * sw] += wv * in[ow];
              });
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
    const auto dyd = to_double<T>(dy, c.y_numel()), xd = to_double<T>(x, c.x_numel());
    const int64_t HW = c.H * c.W, OHW = c.oh() * c.ow(), sw = c.stride_w;
    // One partial sum per output column, so the inner loop has no loop-carried dependency.
    std::vector<double> lane(static_cast<size_t>(c.ow()));
    for (int64_t co = 0; co < c.Cout; ++co) {
      for (int64_t ci = 0; ci < c.Cin; ++ci)
        for (int64_t kh = 0; kh < c.KH; ++kh)
          for (int64_t kw = 0; kw < c.KW; ++kw) {
            std::fill(lane.begin(), lane.end(), 0.0);
            for (int64_t n = 0; n < c.N; ++n) {
              const double* dyp = &dyd[size_t((n * c.Cout + co) * OHW)];
              const double* xp = &xd[size_t((n * c.Cin + ci) * HW)];
              for_each_row(c, kh, kw, [&](int64_t xi, int64_t yi, Range r) {
                double* __restrict out = lane.data();
                const double* __restrict grad = dyp + yi;
                const double* __restrict in = xp + xi;
                for (int64_t ow = r.lo; ow < r.hi; ++ow) out[ow] += grad[ow] * in[ow * sw];
              });
            }
            double sum = 0;
            for (double v : lane) sum += v;
            float& g = dw[((co * c.Cin + ci) * c.KH + kh) * c.KW + kw];
            g = float(double(g) + sum);
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
