#include "kernels/activation.h"

#include <cmath>

namespace zp::kernels::cpu {
namespace {

constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1/sqrt(2 pi)
constexpr double kGeluCubic = 0.044715;

double gelu(double x, GeluKind kind) {
  if (kind == GeluKind::Erf) return 0.5 * x * (1.0 + std::erf(x * kInvSqrt2));
  return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + kGeluCubic * x * x * x)));
}

double gelu_grad(double x, GeluKind kind) {
  if (kind == GeluKind::Erf) return 0.5 * (1.0 + std::erf(x * kInvSqrt2)) + x * kInvSqrt2Pi * std::exp(-0.5 * x * x);
  double t = std::tanh(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * x * x);
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double silu(double x) { return x * sigmoid(x); }
double silu_grad(double x) {
  double sg = sigmoid(x);
  return sg * (1.0 + x * (1.0 - sg));
}

}  // namespace

void gelu_forward(StreamHandle, DType dt, void* y, const void* x, int64_t n, GeluKind kind) {
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    auto* py = static_cast<T*>(y);
    auto* px = static_cast<const T*>(x);
    for (int64_t i = 0; i < n; ++i) py[i] = T(gelu(double(px[i]), kind));
  });
}

void gelu_backward(StreamHandle, DType dt, void* dx, const void* dy, const void* x, int64_t n, GeluKind kind) {
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    auto* pdx = static_cast<T*>(dx);
    auto* pdy = static_cast<const T*>(dy);
    auto* px = static_cast<const T*>(x);
    for (int64_t i = 0; i < n; ++i) pdx[i] = T(double(pdy[i]) * gelu_grad(double(px[i]), kind));
  });
}

void silu_forward(StreamHandle, DType dt, void* y, const void* x, int64_t n) {
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    auto* py = static_cast<T*>(y);
    auto* px = static_cast<const T*>(x);
    for (int64_t i = 0; i < n; ++i) py[i] = T(silu(double(px[i])));
  });
}

void silu_backward(StreamHandle, DType dt, void* dx, const void* dy, const void* x, int64_t n) {
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    auto* pdx = static_cast<T*>(dx);
    auto* pdy = static_cast<const T*>(dy);
    auto* px = static_cast<const T*>(x);
    for (int64_t i = 0; i < n; ++i) pdx[i] = T(double(pdy[i]) * silu_grad(double(px[i])));
  });
}

void swiglu_forward(StreamHandle, DType dt, void* y, const void* gate, const void* up, int64_t n) {
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    auto* py = static_cast<T*>(y);
    auto* pg = static_cast<const T*>(gate);
    auto* pu = static_cast<const T*>(up);
    for (int64_t i = 0; i < n; ++i) py[i] = T(silu(double(pg[i])) * double(pu[i]));
  });
}

void swiglu_backward(StreamHandle, DType dt, void* dgate, void* dup, const void* dy, const void* gate,
                     const void* up, int64_t n) {
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    auto* pdg = static_cast<T*>(dgate);
    auto* pdu = static_cast<T*>(dup);
    auto* pdy = static_cast<const T*>(dy);
    auto* pg = static_cast<const T*>(gate);
    auto* pu = static_cast<const T*>(up);
    for (int64_t i = 0; i < n; ++i) {
      double g = double(pg[i]), u = double(pu[i]), d = double(pdy[i]);
      pdg[i] = T(d * u * silu_grad(g));
      pdu[i] = T(d * silu(g));
    }
  });
}

void swiglu_forward_packed(StreamHandle, DType dt, void* y, const void* x, int64_t rows, int64_t D) {
  ZP_CHECK(rows >= 0 && D >= 0, "rows=", rows, " D=", D);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    for (int64_t r = 0; r < rows; ++r) {
      const T* gate = static_cast<const T*>(x) + r * 2 * D;
      const T* up = gate + D;
      T* out = static_cast<T*>(y) + r * D;
      for (int64_t c = 0; c < D; ++c) out[c] = T(silu(double(gate[c])) * double(up[c]));
    }
  });
}

void swiglu_backward_packed(StreamHandle, DType dt, void* dx, const void* dy, const void* x, int64_t rows,
                            int64_t D) {
  ZP_CHECK(rows >= 0 && D >= 0, "rows=", rows, " D=", D);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    for (int64_t r = 0; r < rows; ++r) {
      const T* gate = static_cast<const T*>(x) + r * 2 * D;
      const T* up = gate + D;
      const T* d = static_cast<const T*>(dy) + r * D;
      T* dgate = static_cast<T*>(dx) + r * 2 * D;
      T* dup = dgate + D;
      for (int64_t c = 0; c < D; ++c) {
        double g = double(gate[c]), u = double(up[c]), dd = double(d[c]);
        dgate[c] = T(dd * u * silu_grad(g));
        dup[c] = T(dd * silu(g));
      }
    }
  });
}

void geglu_forward_packed(StreamHandle, DType dt, void* y, const void* x, int64_t rows, int64_t D) {
  ZP_CHECK(rows >= 0 && D >= 0, "rows=", rows, " D=", D);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    for (int64_t r = 0; r < rows; ++r) {
      const T* hidden = static_cast<const T*>(x) + r * 2 * D;
      const T* gate = hidden + D;
      T* out = static_cast<T*>(y) + r * D;
      for (int64_t c = 0; c < D; ++c) out[c] = T(double(hidden[c]) * gelu(double(gate[c]), GeluKind::Erf));
    }
  });
}

void geglu_backward_packed(StreamHandle, DType dt, void* dx, const void* dy, const void* x, int64_t rows,
                           int64_t D) {
  ZP_CHECK(rows >= 0 && D >= 0, "rows=", rows, " D=", D);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    for (int64_t r = 0; r < rows; ++r) {
      const T* hidden = static_cast<const T*>(x) + r * 2 * D;
      const T* gate = hidden + D;
      const T* d = static_cast<const T*>(dy) + r * D;
      T* dhidden = static_cast<T*>(dx) + r * 2 * D;
      T* dgate = dhidden + D;
      for (int64_t c = 0; c < D; ++c) {
        double h = double(hidden[c]), g = double(gate[c]), dd = double(d[c]);
        dhidden[c] = T(dd * gelu(g, GeluKind::Erf));
        dgate[c] = T(dd * h * gelu_grad(g, GeluKind::Erf));
      }
    }
  });
}

}  // namespace zp::kernels::cpu
