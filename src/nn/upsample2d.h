// diffusers' Upsample2D with use_conv, the end of every UNet up block but the last: nearest-neighbour
// 2x, then a 3x3 convolution.
#pragma once
#include "nn/context.h"
#include "nn/conv2d.h"

namespace zp::nn {

class Upsample2D {
 public:
  struct Saved {
    // The convolution's input: the upsampled x, or x itself when checkpointed (a quarter of the size;
    // the backward upsamples it again).
    Tensor conv_in;
    bool checkpointed = false;
  };
  Upsample2D() = default;
  explicit Upsample2D(Conv2d conv) : conv_(conv) {}
  bool defined() const { return conv_.defined(); }

  // y[B, 2H, 2W, C] from x[B, H, W, C].
  Tensor forward(const Ctx& c, const Tensor& x, int64_t H, int64_t W, Saved& saved, bool checkpoint) const;
  // Returns dx[B, H, W, C]; parameter gradients accumulate, or with `later` (a split backward,
  // nn/deferred_weight_grads.h) are left in it. Consumes `saved`.
  Tensor backward(const Ctx& c, const Tensor& dy, int64_t H, int64_t W, Saved& saved,
                  DeferredWeightGrads* later = nullptr) const;

 private:
  Conv2d conv_;
};

}  // namespace zp::nn
