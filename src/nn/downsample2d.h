// diffusers' Downsample2D with use_conv, the end of every UNet down block but the last: a 3x3
// convolution of stride 2 (padding 1).
#pragma once
#include "nn/context.h"
#include "nn/conv2d.h"

namespace zp::nn {

class Downsample2D {
 public:
  struct Saved {
    Tensor x;  // the input: in the UNet also a skip connection, so it costs nothing extra
  };
  Downsample2D() = default;
  explicit Downsample2D(Conv2d conv) : conv_(conv) {}
  bool defined() const { return conv_.defined(); }

  // y[B, OH, OW, C] from x[B, H, W, C], OH = ceil(H / 2) and OW likewise.
  Tensor forward(const Ctx& c, const Tensor& x, int64_t H, int64_t W, Saved& saved) const;
  // Returns dx[B, H, W, C]; parameter gradients accumulate, or with `later` (a split backward,
  // nn/deferred_weight_grads.h) are left in it. Consumes `saved`.
  Tensor backward(const Ctx& c, const Tensor& dy, int64_t H, int64_t W, Saved& saved,
                  DeferredWeightGrads* later = nullptr) const;

 private:
  Conv2d conv_;
};

}  // namespace zp::nn
