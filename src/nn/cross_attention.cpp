#include "nn/cross_attention.h"

#include "kernels/attention.h"
#include "nn/deferred_weight_grads.h"

namespace zp::nn {
using namespace zp::kernels;

CrossAttention::CrossAttention(Linear q, Linear kv, Linear out, int64_t heads)
    : q_(q), kv_(kv), out_(out), heads_(heads), inner_(out.in()) {
  ZP_CHECK(q.out() == inner_ && kv.out() == 2 * inner_ && q.in() == out.out(), "cross-attention: projections q ",
           q.out(), "x", q.in(), ", k|v ", kv.out(), "x", kv.in(), ", out ", out.out(), "x", out.in(), " disagree");
  ZP_CHECK(heads_ > 0 && inner_ % heads_ == 0, "cross-attention: ", inner_, " does not split into ", heads_, " heads");
}

void CrossAttention::forward(const Ctx& c, void* y, const void* x, int64_t B, int64_t T, const void* context,
                             int64_t L, Saved& saved) const {
  ZP_CHECK(context, "cross-attention without a context");
  const int64_t N = B * T, I = inner_, H = heads_, D = head_dim();
  const size_t esz = dtype_size(c.dt);
  saved.att = c.saved({N, I});
  saved.lse = c.saved({B, H, T}, DType::F32);
  saved.q = c.saved({N, I});
  saved.kv = c.saved({B * L, 2 * I});
  q_.forward(c, saved.q.data(), x, N);
  kv_.forward(c, saved.kv.data(), context, B * L);
  const char* kv = static_cast<const char*>(saved.kv.data());
  ZP_KERNEL_CALL(c.dev, attention_forward, c.s, c.dt, saved.att.data(), saved.lse.data<float>(), saved.q.data(), kv,
                 kv + size_t(I) * esz, B, T, L, H, H, D, I, 2 * I, 2 * I, I, attention_default_scale(D), false);
  out_.forward(c, y, saved.att.data(), N);
}

void CrossAttention::backward(const Ctx& c, void* dx, void* dcontext, const Tensor& dy, const Tensor& x,
                              const Tensor& context, int64_t B, int64_t T, int64_t L, const Saved& saved,
                              bool accumulate_dx, bool accumulate_dcontext, DeferredWeightGrads* later) const {
  const int64_t N = B * T, I = inner_, H = heads_, D = head_dim();
  const size_t esz = dtype_size(c.dt);
  Tensor datt = c.act({N, I});
  out_.backward(c, datt.data(), dy, saved.att, N, false, later);
  Tensor dq = c.act({N, I}), dkv = c.act({B * L, 2 * I});
  const char* kbase = static_cast<const char*>(saved.kv.data());
  char* dkbase = static_cast<char*>(dkv.data());
  const size_t vo = size_t(I) * esz;
  ZP_KERNEL_CALL(c.dev, attention_backward, c.s, c.dt, dq.data(), dkbase, dkbase + vo, datt.data(), saved.q.data(),
                 kbase, kbase + vo, saved.att.data(), saved.lse.data<float>(), B, T, L, H, H, D, I, 2 * I, 2 * I, I,
                 attention_default_scale(D), false);
  q_.backward(c, dx, dq, x, N, accumulate_dx, later);
  kv_.backward(c, dcontext, dkv, context, B * L, accumulate_dcontext, later);
}

}  // namespace zp::nn
