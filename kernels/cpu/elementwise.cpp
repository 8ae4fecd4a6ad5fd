#include "kernels/elementwise.h"

namespace zp::kernels::cpu {

void cast(StreamHandle, DType dst_dt, void* dst, DType src_dt, const void* src, int64_t n) {
  ZP_DISPATCH_FLOAT(dst_dt, D, [&] {
    ZP_DISPATCH_FLOAT(src_dt, S, [&] {
      auto* d = static_cast<D*>(dst);
      auto* x = static_cast<const S*>(src);
      for (int64_t i = 0; i < n; ++i) d[i] = D(double(x[i]));
    });
  });
}

void scale(StreamHandle, DType dt, void* y, const void* x, float alpha, int64_t n) {
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    for (int64_t i = 0; i < n; ++i)
      static_cast<T*>(y)[i] = T(alpha * double(static_cast<const T*>(x)[i]));
  });
}

void add(StreamHandle, DType dt, void* z, const void* x, const void* y, int64_t n) {
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    for (int64_t i = 0; i < n; ++i)
      static_cast<T*>(z)[i] = T(double(static_cast<const T*>(x)[i]) + double(static_cast<const T*>(y)[i]));
  });
}

void axpy(StreamHandle, DType dt, void* y, float alpha, const void* x, int64_t n) {
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    auto* py = static_cast<T*>(y);
    for (int64_t i = 0; i < n; ++i) py[i] = T(double(py[i]) + alpha * double(static_cast<const T*>(x)[i]));
  });
}

void fill(StreamHandle, DType dt, void* y, float value, int64_t n) {
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    for (int64_t i = 0; i < n; ++i) static_cast<T*>(y)[i] = T(value);
  });
}

}  // namespace zp::kernels::cpu
