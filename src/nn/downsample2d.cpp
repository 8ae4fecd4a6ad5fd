#include "nn/downsample2d.h"

namespace zp::nn {

Tensor Downsample2D::forward(const Ctx& c, const Tensor& x, int64_t H, int64_t W, Saved& saved) const {
  const kernels::Conv2dShape s = conv_.shape(x.size(0), H, W);
  saved.x = x;
  Tensor y = c.act({s.N, s.oh(), s.ow(), s.Cout});
  conv_.forward(c, y.data(), x.data(), s.N, H, W);
  return y;
}

Tensor Downsample2D::backward(const Ctx& c, const Tensor& dy, int64_t H, int64_t W, Saved& saved,
                             DeferredWeightGrads* later) const {
  const int64_t B = dy.size(0), C = conv_.in();
  Tensor dx = c.act({B, H, W, C});
  conv_.backward(c, dx.data(), dy, saved.x, B, H, W, false, later);
  saved = {};
  return dx;
}

}  // namespace zp::nn
