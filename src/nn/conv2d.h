// 2-d convolution module (NCHW) over a weight Parameter [Cout, Cin, KH, KW] and an optional bias
// [Cout], with square stride and padding: the UNet's 3x3 convolutions (stride 1, or 2 to downsample)
// and its 1x1 shortcut and projection convolutions.
#pragma once
#include "kernels/conv2d.h"
#include "nn/context.h"
#include "nn/parameter.h"

namespace zp::nn {

class Conv2d {
 public:
  Conv2d() = default;
  Conv2d(Parameter* weight, Parameter* bias, int64_t stride, int64_t pad);

  int64_t in() const { return w_->shape[1]; }
  int64_t out() const { return w_->shape[0]; }
  bool defined() const { return w_ != nullptr; }
  kernels::Conv2dShape shape(int64_t N, int64_t H, int64_t W) const;

  // y[N, Cout, OH, OW] = conv(x[N, Cin, H, W]) + bias
  void forward(const Ctx& c, void* y, const void* x, int64_t N, int64_t H, int64_t W) const;
  // dweight and dbias accumulate (fp32); dx is written, or added with accumulate_dx; dx may be
  // nullptr (no input gradient).
  void backward(const Ctx& c, void* dx, const void* dy, const void* x, int64_t N, int64_t H, int64_t W,
                bool accumulate_dx = false) const;

 private:
  Parameter* w_ = nullptr;
  Parameter* b_ = nullptr;
  int64_t stride_ = 1, pad_ = 0;
};

}  // namespace zp::nn
