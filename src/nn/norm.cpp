#include "nn/norm.h"

#include "kernels/layernorm.h"
#include "kernels/rmsnorm.h"
#include "nn/deferred_weight_grads.h"

namespace zp::nn {
using namespace zp::kernels;

void Norm::forward(const Ctx& c, void* y, const void* x, int64_t N, Saved& saved) const {
  int64_t C = width();
  saved.rstd = c.saved({N}, DType::F32);
  if (kind_ == NormKind::LayerNorm) {
    saved.mean = c.saved({N}, DType::F32);
    ZP_KERNEL_CALL(c.dev, layernorm_forward, c.s, c.dt, y, saved.mean.data<float>(), saved.rstd.data<float>(), x,
                   w_->v(), b_ ? b_->v() : nullptr, N, C, eps_);
  } else {
    ZP_KERNEL_CALL(c.dev, rmsnorm_forward, c.s, c.dt, y, saved.rstd.data<float>(), x, w_->v(), N, C, eps_);
  }
}

void Norm::backward(const Ctx& c, void* dx, const void* dy, const void* x, int64_t N, const Saved& saved,
                    bool accumulate_dx, DeferredWeightGrads* later) const {
  int64_t C = width();
  // Frozen weights (a LoRA run's base) have no gradient buffer: the kernels' weight sums go to scratch.
  Tensor scratch;
  float *dw = nullptr, *db = nullptr;
  if (w_->frozen) {
    scratch = Tensor::zeros({2 * C}, DType::F32, c.dev, "activations", c.s);
    dw = scratch.data<float>();
    db = b_ ? dw + C : nullptr;
  } else if (later) {
    dw = later->norm(w_, b_, C, c);
    db = b_ ? dw + C : nullptr;
  } else {
    dw = w_->g();
    db = b_ ? b_->g() : nullptr;
  }
  if (kind_ == NormKind::LayerNorm)
    ZP_KERNEL_CALL(c.dev, layernorm_backward, c.s, c.dt, dx, dw, db, dy, x, w_->v(),
                   saved.mean.data<float>(), saved.rstd.data<float>(), N, C, accumulate_dx);
  else
    ZP_KERNEL_CALL(c.dev, rmsnorm_backward, c.s, c.dt, dx, dw, dy, x, w_->v(), saved.rstd.data<float>(), N, C,
                   accumulate_dx);
}

}  // namespace zp::nn
