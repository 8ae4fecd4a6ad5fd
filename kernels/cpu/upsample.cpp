#include "kernels/upsample.h"

namespace zp::kernels::cpu {

void upsample_nearest2x_forward(StreamHandle, DType dt, void* y, const void* x, int64_t N, int64_t C, int64_t H,
                                int64_t W) {
  ZP_CHECK(N >= 0 && C >= 0 && H >= 0 && W >= 0, "N=", N, " C=", C, " H=", H, " W=", W);
  ZP_DISPATCH_FLOAT(dt, E, [&] {
    for (int64_t img = 0; img < N * C; ++img) {
      const E* in = static_cast<const E*>(x) + img * H * W;
      E* out = static_cast<E*>(y) + img * 4 * H * W;
      for (int64_t oh = 0; oh < 2 * H; ++oh)
        for (int64_t ow = 0; ow < 2 * W; ++ow) out[oh * 2 * W + ow] = in[(oh / 2) * W + ow / 2];
    }
  });
}

void upsample_nearest2x_backward(StreamHandle, DType dt, void* dx, const void* dy, int64_t N, int64_t C, int64_t H,
                                 int64_t W) {
  ZP_CHECK(N >= 0 && C >= 0 && H >= 0 && W >= 0, "N=", N, " C=", C, " H=", H, " W=", W);
  ZP_DISPATCH_FLOAT(dt, E, [&] {
    for (int64_t img = 0; img < N * C; ++img) {
      const E* g = static_cast<const E*>(dy) + img * 4 * H * W;
      E* out = static_cast<E*>(dx) + img * H * W;
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < W; ++w) {
          const E* top = g + (2 * h) * 2 * W + 2 * w;
          const E* bottom = top + 2 * W;
          out[h * W + w] = E(double(top[0]) + double(top[1]) + double(bottom[0]) + double(bottom[1]));
        }
    }
  });
}

}  // namespace zp::kernels::cpu
