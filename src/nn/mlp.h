// The transformer feed-forward: GPT-2's fc -> GELU(tanh) -> proj, or Llama's gated SwiGLU with the
// gate and up projections packed into one [2F, C] matrix (gate rows first) -> silu(gate) * up -> down.
#pragma once
#include "nn/context.h"
#include "nn/linear.h"

namespace zp::nn {

class DeferredWeightGrads;

enum class MlpKind { GeluTanh, SwiGLU };

class Mlp {
 public:
  // Only the up projection's output is kept: the activation (input of the down projection) is
  // recomputed in the backward, which costs one cheap pointwise pass and saves N x F activations
  // per layer (a quarter of a GPT-2 layer's saved memory). GELU runs inside the GEMMs' epilogues:
  // the up projection writes gelu(pre) and pre at once, and the down projection's input gradient
  // comes out already multiplied by gelu'(pre).
  struct Saved {
    Tensor pre;  // [N, F] (GELU) or [N, 2F] (SwiGLU)
  };
  Mlp() = default;
  Mlp(MlpKind kind, Linear up, Linear down) : kind_(kind), up_(up), down_(down) {}
  // y = mlp(x) (+ residual, added by the down projection's GEMM).
  void forward(const Ctx& c, void* y, const void* x, int64_t N, Saved& saved, const void* residual = nullptr) const;
  // Inference: y = mlp(norm(x)) (+ residual), keeping nothing; the norm runs inside the up
  // projection's product where it can (Linear::forward_normed).
  void forward_normed(const Ctx& c, void* y, const void* x, const Norm& norm, int64_t N,
                      const void* residual = nullptr) const;
  // With `later` (a split backward, nn/deferred_weight_grads.h) only dx is computed here; the
  // projections' weight gradients are left in `later`, which holds dy, x and the recomputed
  // activation until then (dy and x must not change before its W).
  void backward(const Ctx& c, void* dx, const Tensor& dy, const Tensor& x, int64_t N, const Saved& saved,
                bool accumulate_dx, DeferredWeightGrads* later = nullptr) const;

 private:
  int64_t hidden() const { return down_.in(); }
  void activate(const Ctx& c, void* h, const void* pre, int64_t N) const;
  MlpKind kind_ = MlpKind::GeluTanh;
  Linear up_, down_;
};

}  // namespace zp::nn
