#include "kernels/upsample.h"

namespace zp::kernels::cpu {

void upsample_nearest2x_forward(StreamHandle, DType dt, void* y, const void* x, int64_t N, int64_t C, int64_t H,
                                int64_t W) {
  ZP_CHECK(N >= 0 && C >= 0 && H >= 0 && W >= 0, "N=", N, " C=", C, " H=", H, " W=", W);
  ZP_DISPATCH_FLOAT(dt, E, [&] {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t oh = 0; oh < 2 * H; ++oh)
        for (int64_t ow = 0; ow < 2 * W; ++ow) {
          const E* in = static_cast<const E*>(x) + ((n * H + oh / 2) * W + ow / 2) * C;
          E* out = static_cast<E*>(y) + ((n * 2 * H + oh) * 2 * W + ow) * C;
          for (int64_t c = 0; c < C; ++c) out[c] = in[c];
        }
  });
}

void upsample_nearest2x_backward(StreamHandle, DType dt, void* dx, const void* dy, int64_t N, int64_t C, int64_t H,
                                 int64_t W) {
  ZP_CHECK(N >= 0 && C >= 0 && H >= 0 && W >= 0, "N=", N, " C=", C, " H=", H, " W=", W);
  ZP_DISPATCH_FLOAT(dt, E, [&] {
    const E* g = static_cast<const E*>(dy);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < W; ++w) {
          // The four children (2h + a, 2w + b) of pixel (h, w), each a row of C channels.
          const E* c00 = g + ((n * 2 * H + 2 * h) * 2 * W + 2 * w) * C;
          const E* c01 = c00 + C;
          const E* c10 = c00 + 2 * W * C;
          const E* c11 = c10 + C;
          E* out = static_cast<E*>(dx) + ((n * H + h) * W + w) * C;
          for (int64_t c = 0; c < C; ++c)
            out[c] = E(double(c00[c]) + double(c01[c]) + double(c10[c]) + double(c11[c]));
        }
  });
}

}  // namespace zp::kernels::cpu
