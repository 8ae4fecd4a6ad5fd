// The transformer feed-forward: GPT-2's fc -> GELU(tanh) -> proj, or Llama's gated SwiGLU with the
// gate and up projections packed into one [2F, C] matrix (gate rows first) -> silu(gate) * up -> down.
#pragma once
#include "nn/context.h"
#include "nn/linear.h"

namespace zp::nn {

enum class MlpKind { GeluTanh, SwiGLU };

class Mlp {
 public:
  struct Saved {
    Tensor pre;  // [N, F] (GELU) or [N, 2F] (SwiGLU): the up projection's output
    Tensor h;    // [N, F]: the activation, input of the down projection
  };
  Mlp() = default;
  Mlp(MlpKind kind, Linear up, Linear down) : kind_(kind), up_(up), down_(down) {}
  void forward(const Ctx& c, void* y, const void* x, int64_t N, Saved& saved) const;
  void backward(const Ctx& c, void* dx, const void* dy, const void* x, int64_t N, const Saved& saved,
                bool accumulate_dx) const;

 private:
  int64_t hidden() const { return down_.in(); }
  MlpKind kind_ = MlpKind::GeluTanh;
  Linear up_, down_;
};

}  // namespace zp::nn
