#include "kernels/groupnorm.h"

#include <cmath>
#include <vector>

namespace zp::kernels::cpu {
namespace {

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

void check_sizes(int64_t N, int64_t C, int64_t HW, int64_t G) {
  ZP_CHECK(N >= 0 && C > 0 && HW > 0 && G > 0 && C % G == 0, "N=", N, " C=", C, " HW=", HW, " G=", G);
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
        const int64_t begin = (n * C + g * Cg) * HW;  // a group is contiguous in NCHW
        double m = 0;
        for (int64_t i = 0; i < M; ++i) m += double(px[begin + i]);
        m /= double(M);
        double var = 0;
        for (int64_t i = 0; i < M; ++i) var += (double(px[begin + i]) - m) * (double(px[begin + i]) - m);
        double r = 1.0 / std::sqrt(var / double(M) + double(eps));
        for (int64_t i = 0; i < M; ++i) {
          int64_t c = g * Cg + i / HW;
          double z = (double(px[begin + i]) - m) * r * double(w[c]) + double(b[c]);
          py[begin + i] = T(silu ? z * sigmoid(z) : z);
        }
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
    std::vector<double> dz(static_cast<size_t>(M)), xhat(static_cast<size_t>(M));  // one group's values
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t g = 0; g < G; ++g) {
        const int64_t begin = (n * C + g * Cg) * HW;
        const double m = mean[n * G + g], r = rstd[n * G + g];
        double g_mean = 0, gx_mean = 0;
        for (int64_t i = 0; i < M; ++i) {
          int64_t c = g * Cg + i / HW;
          double xh = (double(px[begin + i]) - m) * r, d = double(pdy[begin + i]);
          if (silu) {
            double z = xh * double(w[c]) + double(b[c]), sg = sigmoid(z);
            d *= sg * (1.0 + z * (1.0 - sg));
          }
          xhat[size_t(i)] = xh;
          dz[size_t(i)] = d;
          g_mean += d * double(w[c]);
          gx_mean += d * double(w[c]) * xh;
          dw[size_t(c)] += d * xh;
          db[size_t(c)] += d;
        }
        g_mean /= double(M);
        gx_mean /= double(M);
        for (int64_t i = 0; i < M; ++i) {
          int64_t c = g * Cg + i / HW;
          pdx[begin + i] = T(r * (dz[size_t(i)] * double(w[c]) - g_mean - xhat[size_t(i)] * gx_mean));
        }
      }
    }
    for (int64_t c = 0; c < C; ++c) {
      dweight[c] = float(double(dweight[c]) + dw[size_t(c)]);
      dbias[c] = float(double(dbias[c]) + db[size_t(c)]);
    }
  });
}

}  // namespace zp::kernels::cpu
