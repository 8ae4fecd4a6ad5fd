#include "nn/mlp.h"

#include "kernels/activation.h"
#include "nn/deferred_weight_grads.h"

namespace zp::nn {
using namespace zp::kernels;

void Mlp::activate(const Ctx& c, void* h, const void* pre, int64_t N) const {
  const int64_t F = hidden();
  if (kind_ == MlpKind::GeluTanh)
    ZP_KERNEL_CALL(c.dev, gelu_forward, c.s, c.dt, h, pre, N * F, GeluKind::Tanh);
  else
    ZP_KERNEL_CALL(c.dev, swiglu_forward_packed, c.s, c.dt, h, pre, N, F);
}

void Mlp::forward(const Ctx& c, void* y, const void* x, int64_t N, Saved& saved, const void* residual) const {
  saved.pre = c.saved({N, up_.out()});
  Tensor h = c.act({N, hidden()});
  if (kind_ == MlpKind::GeluTanh) {
    up_.forward_gelu(c, h.data(), saved.pre.data(), x, N);
  } else {
    up_.forward(c, saved.pre.data(), x, N);
    activate(c, h.data(), saved.pre.data(), N);
  }
  down_.forward(c, y, h.data(), N, 0, residual);
}

void Mlp::forward_normed(const Ctx& c, void* y, const void* x, const Norm& norm, int64_t N,
                         const void* residual) const {
  Ctx working = c;
  working.saves = false;
  if (kind_ == MlpKind::SwiGLU) {
    Tensor h = c.act({N, hidden()});
    if (!up_.forward_normed_swiglu(working, h.data(), x, norm, N)) {
      Tensor pre = c.act({N, up_.out()});
      up_.forward_normed(working, pre.data(), x, norm, N);
      activate(working, h.data(), pre.data(), N);
    }
    down_.forward(working, y, h.data(), N, 0, residual);
    return;
  }
  Tensor a = c.act({N, up_.in()});
  Norm::Saved unused_norm;
  norm.forward(working, a.data(), x, N, unused_norm);
  Saved unused;
  forward(working, y, a.data(), N, unused, residual);
}

void Mlp::backward(const Ctx& c, void* dx, const Tensor& dy, const Tensor& x, int64_t N, const Saved& saved,
                   bool accumulate_dx, DeferredWeightGrads* later) const {
  const int64_t F = hidden();
  {
    Tensor h = c.act({N, F});
    activate(c, h.data(), saved.pre.data(), N);
    if (later)
      later->linear(down_, dy, std::move(h), N);
    else
      down_.backward_params(c, dy.data(), h.data(), N);
  }
  Tensor dpre = c.act({N, up_.out()});
  if (kind_ == MlpKind::GeluTanh) {
    down_.backward_input_gelu(c, dpre.data(), dy.data(), saved.pre.data(), N);
  } else {
    Tensor dh = c.act({N, F});
    down_.backward_input(c, dh.data(), dy.data(), N);
    ZP_KERNEL_CALL(c.dev, swiglu_backward_packed, c.s, c.dt, dpre.data(), dh.data(), saved.pre.data(), N, F);
  }
  if (!later) {
    up_.backward(c, dx, dpre.data(), x.data(), N, accumulate_dx);
    return;
  }
  if (dx) up_.backward_input(c, dx, dpre.data(), N, accumulate_dx);
  later->linear(up_, std::move(dpre), x, N);
}

}  // namespace zp::nn
