#include "kernels/groupnorm.h"

#include <cmath>
#include <vector>

namespace zp::kernels::cpu {
namespace {

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

void check_sizes(int64_t N, int64_t C, int64_t HW, int64_t G) {
  ZP_CHECK(N >= 0 && C > 0 && HW > 0 && G > 0 && C % G == 0, "N=", N, " C=", C, " HW=", HW, " G=", G);
}

// Calls f(offset of element (n, i, c), c) for every element of group (n, g) of x[N, HW, C].
template <class F> void for_each_in_group(int64_t n, int64_t g, int64_t C, int64_t HW, int64_t Cg, F&& f) {
  for (int64_t i = 0; i < HW; ++i)
    for (int64_t c = g * Cg; c < (g + 1) * Cg; ++c) f((n * HW + i) * C + c, c);
}

}  // namespace

void groupnorm_forward(StreamHandle, DType dt, void* y, float* mean, float* rstd, const void* x, const void* weight,
                       const void* bias, int64_t N, int64_t C, int64_t HW, int64_t G, float eps, bool silu) {
  check_sizes(N, C, HW, G);
  ZP_CHECK(mean && rstd && weight && bias);
  const int64_t Cg = C / G, M = Cg * HW;  // channels per group, elements per group
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    auto* py = static_cast<T*>(y);
    auto* px = static_cast<const T*>(x);
    auto* w = static_cast<const T*>(weight);
    auto* b = static_cast<const T*>(bias);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t g = 0; g < G; ++g) {
        double m = 0;
        for_each_in_group(n, g, C, HW, Cg, [&](int64_t e, int64_t) { m += double(px[e]); });
        m /= double(M);
        double var = 0;
        for_each_in_group(n, g, C, HW, Cg, [&](int64_t e, int64_t) { var += (double(px[e]) - m) * (double(px[e]) - m); });
        const double r = 1.0 / std::sqrt(var / double(M) + double(eps));
        for_each_in_group(n, g, C, HW, Cg, [&](int64_t e, int64_t c) {
          const double z = (double(px[e]) - m) * r * double(w[c]) + double(b[c]);
          py[e] = T(silu ? z * sigmoid(z) : z);
        });
        mean[n * G + g] = float(m);
        rstd[n * G + g] = float(r);
      }
    }
  });
}

// dz = dy (or dy * silu'(z)), g = dz * weight[c], xhat = (x - mean) * rstd; over each group:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dweight[c] += dz * xhat,  dbias[c] += dz.
void groupnorm_backward(StreamHandle, DType dt, void* dx, float* dweight, float* dbias, const void* dy,
                        const void* x, const void* weight, const void* bias, const float* mean, const float* rstd,
                        int64_t N, int64_t C, int64_t HW, int64_t G, bool silu) {
  check_sizes(N, C, HW, G);
  ZP_CHECK(dweight && dbias && weight && bias && mean && rstd);
  const int64_t Cg = C / G, M = Cg * HW;
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    auto* pdx = static_cast<T*>(dx);
    auto* pdy = static_cast<const T*>(dy);
    auto* px = static_cast<const T*>(x);
    auto* w = static_cast<const T*>(weight);
    auto* b = static_cast<const T*>(bias);
    std::vector<double> dw(size_t(C), 0.0), db(size_t(C), 0.0);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t g = 0; g < G; ++g) {
        const double m = mean[n * G + g], r = rstd[n * G + g];
        auto grads = [&](int64_t e, int64_t c, double& xh) {  // dz of element e; xh gets its xhat
          xh = (double(px[e]) - m) * r;
          double d = double(pdy[e]);
          if (silu) {
            const double z = xh * double(w[c]) + double(b[c]), sg = sigmoid(z);
            d *= sg * (1.0 + z * (1.0 - sg));
          }
          return d;
        };
        double g_mean = 0, gx_mean = 0;
        for_each_in_group(n, g, C, HW, Cg, [&](int64_t e, int64_t c) {
          double xh;
          const double d = grads(e, c, xh);
          g_mean += d * double(w[c]);
          gx_mean += d * double(w[c]) * xh;
          dw[size_t(c)] += d * xh;
          db[size_t(c)] += d;
        });
        g_mean /= double(M);
        gx_mean /= double(M);
        for_each_in_group(n, g, C, HW, Cg, [&](int64_t e, int64_t c) {
          double xh;
          const double d = grads(e, c, xh);
          pdx[e] = T(r * (d * double(w[c]) - g_mean - xh * gx_mean));
        });
      }
    }
    for (int64_t c = 0; c < C; ++c) {
      dweight[c] = float(double(dweight[c]) + dw[size_t(c)]);
      dbias[c] = float(double(dbias[c]) + db[size_t(c)]);
    }
  });
}

}  // namespace zp::kernels::cpu
