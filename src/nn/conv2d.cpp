#include "nn/conv2d.h"

#include "kernels/elementwise.h"

namespace zp::nn {
using namespace zp::kernels;

Conv2d::Conv2d(Parameter* weight, Parameter* bias, int64_t stride, int64_t pad)
    : w_(weight), b_(bias), stride_(stride), pad_(pad) {
  ZP_CHECK(w_ && w_->shape.size() == 4, "Conv2d weight ", w_ ? w_->name : "(null)", " must be [Cout, Cin, KH, KW]");
  ZP_CHECK(!b_ || b_->shape == Shape{w_->shape[0]}, "Conv2d bias ", b_->name, " has shape ", shape_str(b_->shape));
  ZP_CHECK(stride_ > 0 && pad_ >= 0, "Conv2d ", w_->name, ": stride ", stride_, " pad ", pad_);
}

Conv2dShape Conv2d::shape(int64_t N, int64_t H, int64_t W) const {
  Conv2dShape s;
  s.N = N;
  s.Cin = in();
  s.H = H;
  s.W = W;
  s.Cout = out();
  s.KH = w_->shape[2];
  s.KW = w_->shape[3];
  s.stride_h = s.stride_w = stride_;
  s.pad_h = s.pad_w = pad_;
  return s;
}

void Conv2d::forward(const Ctx& c, void* y, const void* x, int64_t N, int64_t H, int64_t W) const {
  ZP_KERNEL_CALL(c.dev, conv2d_forward, c.s, c.dt, y, x, w_->v(), b_ ? b_->v() : nullptr, shape(N, H, W));
}

void Conv2d::backward(const Ctx& c, void* dx, const void* dy, const void* x, int64_t N, int64_t H, int64_t W,
                      bool accumulate_dx) const {
  const Conv2dShape s = shape(N, H, W);
  if (!w_->frozen)  // a frozen weight (LoRA's base) takes no gradient
    ZP_KERNEL_CALL(c.dev, conv2d_backward_filter, c.s, c.dt, w_->g(), b_ ? b_->g() : nullptr, dy, x, s);
  if (!dx) return;
  if (!accumulate_dx) {
    ZP_KERNEL_CALL(c.dev, conv2d_backward_data, c.s, c.dt, dx, dy, w_->v(), s);
    return;
  }
  // The kernel writes its result, so a residual sum goes through a temporary.
  Tensor tmp = c.act({s.x_numel()});
  ZP_KERNEL_CALL(c.dev, conv2d_backward_data, c.s, c.dt, tmp.data(), dy, w_->v(), s);
  ZP_KERNEL_CALL(c.dev, add, c.s, c.dt, dx, dx, tmp.data(), s.x_numel());
}

}  // namespace zp::nn
