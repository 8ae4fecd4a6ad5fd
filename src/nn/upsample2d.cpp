#include "nn/upsample2d.h"

#include "kernels/upsample.h"

namespace zp::nn {
using namespace zp::kernels;

Tensor Upsample2D::forward(const Ctx& c, const Tensor& x, int64_t H, int64_t W, Saved& saved, bool checkpoint) const {
  const int64_t B = x.size(0), C = x.size(3);
  Tensor up = checkpoint ? c.act({B, 2 * H, 2 * W, C}) : c.saved({B, 2 * H, 2 * W, C});
  ZP_KERNEL_CALL(c.dev, upsample_nearest2x_forward, c.s, c.dt, up.data(), x.data(), B, C, H, W);
  saved.conv_in = checkpoint ? x : up;
  saved.checkpointed = checkpoint;
  Tensor y = c.act({B, 2 * H, 2 * W, C});
  conv_.forward(c, y.data(), up.data(), B, 2 * H, 2 * W);
  return y;
}

Tensor Upsample2D::backward(const Ctx& c, const Tensor& dy, int64_t H, int64_t W, Saved& saved,
                           DeferredWeightGrads* later) const {
  const int64_t B = dy.size(0), C = dy.size(3);
  Tensor up = saved.conv_in;
  if (saved.checkpointed) {
    up = c.act({B, 2 * H, 2 * W, C});
    ZP_KERNEL_CALL(c.dev, upsample_nearest2x_forward, c.s, c.dt, up.data(), saved.conv_in.data(), B, C, H, W);
  }
  Tensor du = c.act({B, 2 * H, 2 * W, C});
  conv_.backward(c, du.data(), dy, up, B, 2 * H, 2 * W, false, later);
  Tensor dx = c.act({B, H, W, C});
  ZP_KERNEL_CALL(c.dev, upsample_nearest2x_backward, c.s, c.dt, dx.data(), du.data(), B, C, H, W);
  saved = {};
  return dx;
}

}  // namespace zp::nn
