#include "nn/conv2d.h"

#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "nn/deferred_weight_grads.h"
#include "nn/init.h"

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

void Conv2d::set_adapter(Parameter* a, Parameter* b, float scale, float dropout) {
  ZP_CHECK(dropout >= 0.f && dropout < 1.f, "Conv2d ", w_->name, ": LoRA dropout ", dropout, " is not in [0, 1)");
  ZP_CHECK(a && b && a->shape.size() == 4 && b->shape.size() == 4, "Conv2d ", w_->name, ": LoRA A and B must be 4-d");
  const int64_t r = a->shape[0];
  ZP_CHECK(a->shape == (Shape{r, in(), w_->shape[2], w_->shape[3]}) && b->shape == (Shape{out(), r, 1, 1}), "Conv2d ",
           w_->name, ": adapter ", shape_str(a->shape), " / ", shape_str(b->shape), " does not fit a ",
           shape_str(w_->shape), " weight");
  lora_a_ = a;
  lora_b_ = b;
  scale_ = scale;
  dropout_ = dropout;
  adapter_id_ = fnv1a(a->name);
}

Conv2dShape Conv2d::down_shape(int64_t N, int64_t H, int64_t W) const {
  Conv2dShape s = shape(N, H, W);
  s.Cout = lora_a_->shape[0];
  return s;
}

bool Conv2d::is_pointwise() const {
  return w_->shape[2] == 1 && w_->shape[3] == 1 && stride_ == 1 && pad_ == 0;
}

const void* Conv2d::adapter_input(const Ctx& c, const void* x, int64_t N, int64_t H, int64_t W, Tensor& keep) const {
  if (dropout_ == 0.f || c.dropout.key == 0) return x;
  const int64_t cols = in() * H * W;
  keep = c.act({N, H, W, in()});
  ZP_KERNEL_CALL(c.dev, dropout_apply, c.s, c.dt, keep.data(), cols, x, cols, N, cols, c.dropout.first_row(N),
                 c.dropout.key ^ adapter_id_, dropout_, false);
  return keep.data();
}

void Conv2d::adapter_forward(const Ctx& c, void* y, const void* x, int64_t N, int64_t H, int64_t W) const {
  const Conv2dShape sa = down_shape(N, H, W);
  const int64_t r = sa.Cout, P = N * sa.oh() * sa.ow();
  Tensor dropped;
  Tensor u = c.act({N, sa.oh(), sa.ow(), r});
  ZP_KERNEL_CALL(c.dev, conv2d_forward, c.s, c.dt, u.data(), adapter_input(c, x, N, H, W, dropped), lora_a_->v(),
                 nullptr, sa);
  // y[P, Cout] += scale * u[P, r] B[Cout, r]^T: the 1x1 convolution B, onto the base's output
  ZP_KERNEL_CALL(c.dev, gemm, c.s, c.dt, c.dt, false, true, P, out(), r, scale_, u.data(), r, lora_b_->v(), r, 1.f, y,
                 out());
}

void Conv2d::adapter_backward(const Ctx& c, void* dx, const void* dy, const void* x, int64_t N, int64_t H,
                              int64_t W) const {
  const Conv2dShape sa = down_shape(N, H, W);
  const int64_t r = sa.Cout, P = N * sa.oh() * sa.ow();
  Tensor dropped;
  const void* xin = adapter_input(c, x, N, H, W, dropped);
  {
    Tensor u = c.act({N, sa.oh(), sa.ow(), r});
    ZP_KERNEL_CALL(c.dev, conv2d_forward, c.s, c.dt, u.data(), xin, lora_a_->v(), nullptr, sa);
    // dB[Cout, r] += scale * dy[P, Cout]^T u[P, r], accumulated in fp32
    ZP_KERNEL_CALL(c.dev, gemm, c.s, c.dt, DType::F32, true, false, out(), r, P, scale_, dy, out(), u.data(), r, 1.f,
                   lora_b_->g(), r);
  }
  // du[P, r] = scale * dy[P, Cout] B[Cout, r]
  Tensor du = c.act({N, sa.oh(), sa.ow(), r});
  ZP_KERNEL_CALL(c.dev, gemm, c.s, c.dt, c.dt, false, false, P, r, out(), scale_, dy, out(), lora_b_->v(), r, 0.f,
                 du.data(), r);
  ZP_KERNEL_CALL(c.dev, conv2d_backward_filter, c.s, c.dt, lora_a_->g(), nullptr, du.data(), xin, sa);
  if (!dx) return;
  // dx += A^T du, through the forward's dropout mask when it drew one
  Tensor dxa = c.act({sa.x_numel()});
  ZP_KERNEL_CALL(c.dev, conv2d_backward_data, c.s, c.dt, dxa.data(), du.data(), lora_a_->v(), sa);
  if (dropout_ == 0.f || c.dropout.key == 0) {
    ZP_KERNEL_CALL(c.dev, add, c.s, c.dt, dx, dx, dxa.data(), sa.x_numel());
    return;
  }
  const int64_t cols = in() * H * W;
  ZP_KERNEL_CALL(c.dev, dropout_apply, c.s, c.dt, dx, cols, dxa.data(), cols, N, cols, c.dropout.first_row(N),
                 c.dropout.key ^ adapter_id_, dropout_, true);
}

void Conv2d::forward(const Ctx& c, void* y, const void* x, int64_t N, int64_t H, int64_t W) const {
  if (is_pointwise())  // y[P, Cout] = x[P, Cin] W[Cout, Cin]^T + bias
    ZP_KERNEL_CALL(c.dev, gemm, c.s, c.dt, c.dt, false, true, N * H * W, out(), in(), 1.f, x, in(), w_->v(), in(), 0.f,
                   y, out(), b_ ? GemmEpilogue::Bias : GemmEpilogue::None, b_ ? b_->v() : nullptr);
  else
    ZP_KERNEL_CALL(c.dev, conv2d_forward, c.s, c.dt, y, x, w_->v(), b_ ? b_->v() : nullptr, shape(N, H, W));
  if (lora_a_) adapter_forward(c, y, x, N, H, W);
}

void Conv2d::backward(const Ctx& c, void* dx, const void* dy, const void* x, int64_t N, int64_t H, int64_t W,
                      bool accumulate_dx) const {
  backward_params(c, dy, x, N, H, W);
  if (dx) backward_data(c, dx, dy, N, H, W, accumulate_dx);
  if (lora_a_) adapter_backward(c, dx, dy, x, N, H, W);
}

void Conv2d::backward(const Ctx& c, void* dx, const Tensor& dy, const Tensor& x, int64_t N, int64_t H, int64_t W,
                      bool accumulate_dx, DeferredWeightGrads* later) const {
  if (!later) return backward(c, dx, dy.data(), x.data(), N, H, W, accumulate_dx);
  later->conv(*this, dy, x, N, H, W);
  if (dx) backward_data(c, dx, dy.data(), N, H, W, accumulate_dx);
}

void Conv2d::backward_params(const Ctx& c, const void* dy, const void* x, int64_t N, int64_t H, int64_t W) const {
  if (w_->frozen) return;  // a frozen weight (LoRA's base) takes no gradient
  if (!is_pointwise()) {
    ZP_KERNEL_CALL(c.dev, conv2d_backward_filter, c.s, c.dt, w_->g(), b_ ? b_->g() : nullptr, dy, x, shape(N, H, W));
    return;
  }
  // dW[Cout, Cin] += dy[P, Cout]^T x[P, Cin], accumulated in fp32
  const int64_t P = N * H * W;
  ZP_KERNEL_CALL(c.dev, gemm, c.s, c.dt, DType::F32, true, false, out(), in(), P, 1.f, dy, out(), x, in(), 1.f, w_->g(),
                 in());
  if (b_) ZP_KERNEL_CALL(c.dev, bias_grad, c.s, c.dt, b_->g(), dy, P, out());
}

void Conv2d::backward_data(const Ctx& c, void* dx, const void* dy, int64_t N, int64_t H, int64_t W,
                           bool accumulate_dx) const {
  if (is_pointwise()) {  // dx[P, Cin] (+)= dy[P, Cout] W[Cout, Cin]
    ZP_KERNEL_CALL(c.dev, gemm, c.s, c.dt, c.dt, false, false, N * H * W, in(), out(), 1.f, dy, out(), w_->v(), in(),
                   accumulate_dx ? 1.f : 0.f, dx, in());
    return;
  }
  const Conv2dShape s = shape(N, H, W);
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
