// Nearest-neighbour 2x upsampling of channels-last images (diffusers Upsample2D with
// interpolate(scale_factor=2, mode="nearest")): y[n, 2h + a, 2w + b, c] = x[n, h, w, c] for a, b in {0, 1}.
#pragma once
#include "kernels/kernel.h"

namespace zp::kernels {

// y[N, 2H, 2W, C] from x[N, H, W, C]
ZP_KERNEL(void upsample_nearest2x_forward(StreamHandle s, DType dt, void* y, const void* x, int64_t N, int64_t C,
                                          int64_t H, int64_t W))
// dx[N, H, W, C] = sum of the 4 entries of dy[N, 2H, 2W, C] that copied each x  (written)
ZP_KERNEL(void upsample_nearest2x_backward(StreamHandle s, DType dt, void* dx, const void* dy, int64_t N, int64_t C,
                                           int64_t H, int64_t W))

}  // namespace zp::kernels
