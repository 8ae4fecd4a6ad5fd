#include "kernels/dropout.h"

namespace zp::kernels::cpu {

void dropout_apply(StreamHandle, DType dt, void* y, int64_t ldy, const void* x, int64_t ldx, int64_t rows,
                   int64_t cols, int64_t first_row, uint64_t key, float p, bool accumulate) {
  ZP_CHECK(p >= 0.f && p < 1.f, "dropout probability ", p, " is not in [0, 1)");
  if (!ldx) ldx = cols;
  if (!ldy) ldy = cols;
  const double keep_scale = 1.0 / (1.0 - double(p));
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    const T* px = static_cast<const T*>(x);
    T* py = static_cast<T*>(y);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const uint64_t index = uint64_t(first_row + r) * uint64_t(cols) + uint64_t(c);
        const double v = dropout_keep_draw(key, index) >= p ? double(px[r * ldx + c]) * keep_scale : 0.0;
        T& out = py[r * ldy + c];
        out = T(accumulate ? double(out) + v : v);
      }
  });
}

}  // namespace zp::kernels::cpu
