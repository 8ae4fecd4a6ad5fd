#include "nn/group_norm.h"

#include "kernels/groupnorm.h"
#include "nn/deferred_weight_grads.h"

namespace zp::nn {
using namespace zp::kernels;

GroupNorm::GroupNorm(Parameter* weight, Parameter* bias, int64_t groups, float eps, bool silu)
    : w_(weight), b_(bias), groups_(groups), eps_(eps), silu_(silu) {
  ZP_CHECK(w_ && b_ && w_->shape.size() == 1 && b_->shape == w_->shape, "GroupNorm needs weight and bias [C]");
  ZP_CHECK(groups_ > 0 && channels() % groups_ == 0, "GroupNorm ", w_->name, ": ", channels(),
           " channels do not split into ", groups_, " groups");
}

void GroupNorm::forward(const Ctx& c, void* y, const void* x, int64_t N, int64_t HW, Saved& saved) const {
  saved.mean = c.saved({N, groups_}, DType::F32);
  saved.rstd = c.saved({N, groups_}, DType::F32);
  ZP_KERNEL_CALL(c.dev, groupnorm_forward, c.s, c.dt, y, saved.mean.data<float>(), saved.rstd.data<float>(), x,
                 w_->v(), b_->v(), N, channels(), HW, groups_, eps_, silu_);
}

void GroupNorm::backward(const Ctx& c, void* dx, const void* dy, const void* x, int64_t N, int64_t HW,
                         const Saved& saved, DeferredWeightGrads* later) const {
  // Frozen weights (LoRA's base) have no gradient buffer: the kernel's sums go to scratch.
  Tensor scratch;
  float *dw = nullptr, *db = nullptr;
  if (w_->frozen) {
    scratch = Tensor::zeros({2 * channels()}, DType::F32, c.dev, "activations", c.s);
    dw = scratch.data<float>();
    db = dw + channels();
  } else if (later) {
    dw = later->norm(w_, b_, channels(), c);
    db = dw + channels();
  } else {
    dw = w_->g();
    db = b_->g();
  }
  ZP_KERNEL_CALL(c.dev, groupnorm_backward, c.s, c.dt, dx, dw, db, dy, x, w_->v(), b_->v(),
                 saved.mean.data<float>(), saved.rstd.data<float>(), N, channels(), HW, groups_, silu_);
}

}  // namespace zp::nn
