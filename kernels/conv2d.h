// 2-d convolution of channels-last (NHWC) images, dilation 1, groups 1 (what the UNet needs: 3x3 pad 1
// stride 1 or 2, and 1x1):
//   x[N, H, W, Cin], w[Cout, Cin, KH, KW], bias[Cout], y[N, OH, OW, Cout]; x, w, bias, y are in dt.
// The images are channels-last because cuDNN's tensor-core kernels are (NCHW made cuDNN convert every
// operand both ways); the weight keeps the layout checkpoints and hub files store.
#pragma once
#include "kernels/kernel.h"

namespace zp::kernels {

struct Conv2dShape {
  int64_t N = 1, Cin = 1, H = 1, W = 1, Cout = 1, KH = 1, KW = 1;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  int64_t oh() const { return (H + 2 * pad_h - KH) / stride_h + 1; }
  int64_t ow() const { return (W + 2 * pad_w - KW) / stride_w + 1; }
  int64_t x_numel() const { return N * Cin * H * W; }
  int64_t w_numel() const { return Cout * Cin * KH * KW; }
  int64_t y_numel() const { return N * Cout * oh() * ow(); }
  bool operator==(const Conv2dShape&) const = default;
};

// y = conv(x, w) + bias (bias may be nullptr); in 16-bit dtypes the sum is rounded once, as the CPU
// reference does (on the GPU: cuDNN's fused bias epilogue where it matters, kernels/cuda/conv2d.cu).
ZP_KERNEL(void conv2d_forward(StreamHandle s, DType dt, void* y, const void* x, const void* w, const void* bias,
                              const Conv2dShape& shape))
// dx = conv_transpose(dy, w)  (written).
ZP_KERNEL(void conv2d_backward_data(StreamHandle s, DType dt, void* dx, const void* dy, const void* w,
                                    const Conv2dShape& shape))
// dw += correlation of x with dy; dbias += sum of dy over N, OH, OW (dbias may be nullptr). fp32 grads.
ZP_KERNEL(void conv2d_backward_filter(StreamHandle s, DType dt, float* dw, float* dbias, const void* dy,
                                      const void* x, const Conv2dShape& shape))

}  // namespace zp::kernels
