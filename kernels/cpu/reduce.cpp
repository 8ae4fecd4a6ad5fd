#include "kernels/reduce.h"

namespace zp::kernels::cpu {

void l2norm_squared(StreamHandle, DType dt, float* out, const void* const* ptrs, const int64_t* sizes, int count) {
  ZP_CHECK(count >= 0);
  double sum = 0;
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    for (int t = 0; t < count; ++t) {
      ZP_CHECK(sizes[t] >= 0);
      const T* x = static_cast<const T*>(ptrs[t]);
      for (int64_t i = 0; i < sizes[t]; ++i) sum += double(x[i]) * double(x[i]);
    }
  });
  *out = float(sum);
}

}  // namespace zp::kernels::cpu
