// GroupNorm over channels-last activations, optionally fused with the SiLU that follows it in every UNet
// ResBlock and in the UNet's output head. Channels are split into `groups` groups of consecutive
// channels; weight and bias are [C].
#pragma once
#include "nn/context.h"
#include "nn/parameter.h"

namespace zp::nn {

class DeferredWeightGrads;

class GroupNorm {
 public:
  struct Saved {
    Tensor mean, rstd;  // fp32 [N, groups]
  };
  GroupNorm() = default;
  GroupNorm(Parameter* weight, Parameter* bias, int64_t groups, float eps, bool silu);

  int64_t channels() const { return w_->shape[0]; }
  // y[N, HW, C] = (silu of) groupnorm(x[N, HW, C])
  void forward(const Ctx& c, void* y, const void* x, int64_t N, int64_t HW, Saved& saved) const;
  // dx is written; dweight and dbias accumulate (fp32), or with `later` (a split backward,
  // nn/deferred_weight_grads.h) go to its scratch, added at W.
  void backward(const Ctx& c, void* dx, const void* dy, const void* x, int64_t N, int64_t HW, const Saved& saved,
                DeferredWeightGrads* later = nullptr) const;

 private:
  Parameter* w_ = nullptr;
  Parameter* b_ = nullptr;
  int64_t groups_ = 32;
  float eps_ = 1e-5f;
  bool silu_ = false;
};

}  // namespace zp::nn
