// LayerNorm (GPT-2) and RMSNorm (Llama, Qwen2) over the last dimension, as one module.
#pragma once
#include "nn/context.h"
#include "nn/parameter.h"

namespace zp::nn {

class DeferredWeightGrads;

enum class NormKind { LayerNorm, RMSNorm };

class Norm {
 public:
  struct Saved {
    Tensor mean, rstd;  // fp32 [N]; mean unused by RMSNorm
  };
  Norm() = default;
  Norm(NormKind kind, Parameter* weight, Parameter* bias, float eps) : kind_(kind), w_(weight), b_(bias), eps_(eps) {}
  void forward(const Ctx& c, void* y, const void* x, int64_t N, Saved& saved) const;
  // dx = (or += with accumulate_dx) the input gradient; dweight, dbias accumulate, or with `later`
  // (a split backward, nn/deferred_weight_grads.h) go to its scratch, added in at its W.
  void backward(const Ctx& c, void* dx, const void* dy, const void* x, int64_t N, const Saved& saved,
                bool accumulate_dx, DeferredWeightGrads* later = nullptr) const;
  int64_t width() const { return w_->shape[0]; }
  // An RMSNorm's weight, for a product that applies the norm to its own input (Linear::forward_normed);
  // nullptr for a LayerNorm.
  const void* rms_weight() const { return kind_ == NormKind::RMSNorm ? w_->v() : nullptr; }
  float eps() const { return eps_; }

 private:
  NormKind kind_ = NormKind::LayerNorm;
  Parameter* w_ = nullptr;
  Parameter* b_ = nullptr;
  float eps_ = 1e-5f;
};

}  // namespace zp::nn
