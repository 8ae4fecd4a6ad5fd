#include "nn/cross_attention.h"

#include "kernels/attention.h"

namespace zp::nn {
using namespace zp::kernels;

CrossAttention::CrossAttention(Linear qkv, Linear out, int64_t heads)
    : self_(true), q_(qkv), out_(out), heads_(heads), inner_(out.in()) {
  ZP_CHECK(qkv.out() == 3 * inner_ && qkv.in() == out.out(), "self-attention: q|k|v ", qkv.out(), "x", qkv.in(),
           " does not match the output projection ", out.out(), "x", out.in());
  ZP_CHECK(heads_ > 0 && inner_ % heads_ == 0, "self-attention: ", inner_, " does not split into ", heads_, " heads");
}

CrossAttention::CrossAttention(Linear q, Linear kv, Linear out, int64_t heads)
    : self_(false), q_(q), kv_(kv), out_(out), heads_(heads), inner_(out.in()) {
  ZP_CHECK(q.out() == inner_ && kv.out() == 2 * inner_ && q.in() == out.out(), "cross-attention: projections q ",
           q.out(), "x", q.in(), ", k|v ", kv.out(), "x", kv.in(), ", out ", out.out(), "x", out.in(), " disagree");
  ZP_CHECK(heads_ > 0 && inner_ % heads_ == 0, "cross-attention: ", inner_, " does not split into ", heads_, " heads");
}

void CrossAttention::forward(const Ctx& c, void* y, const void* x, int64_t B, int64_t T, const void* context,
                             int64_t L, Saved& saved) const {
  const int64_t N = B * T, I = inner_, H = heads_, D = head_dim();
  const size_t esz = dtype_size(c.dt);
  saved.att = c.saved({N, I});
  saved.lse = c.saved({B, H, T}, DType::F32);
  const void *q, *k, *v;
  int64_t qs, kvs, Tk;
  if (self_) {
    saved.q = c.saved({N, 3 * I});
    q_.forward(c, saved.q.data(), x, N);
    const char* base = static_cast<const char*>(saved.q.data());
    q = base;
    k = base + size_t(I) * esz;
    v = base + size_t(2 * I) * esz;
    qs = kvs = 3 * I;
    Tk = T;
  } else {
    ZP_CHECK(context, "cross-attention without a context");
    saved.q = c.saved({N, I});
    saved.kv = c.saved({B * L, 2 * I});
    q_.forward(c, saved.q.data(), x, N);
    kv_.forward(c, saved.kv.data(), context, B * L);
    const char* base = static_cast<const char*>(saved.kv.data());
    q = saved.q.data();
    k = base;
    v = base + size_t(I) * esz;
    qs = I;
    kvs = 2 * I;
    Tk = L;
  }
  ZP_KERNEL_CALL(c.dev, attention_forward, c.s, c.dt, saved.att.data(), saved.lse.data<float>(), q, k, v, B, T, Tk,
                 H, H, D, qs, kvs, kvs, I, attention_default_scale(D), false);
  out_.forward(c, y, saved.att.data(), N);
}

void CrossAttention::backward(const Ctx& c, void* dx, void* dcontext, const void* dy, const void* x,
                              const void* context, int64_t B, int64_t T, int64_t L, const Saved& saved,
                              bool accumulate_dx, bool accumulate_dcontext) const {
  const int64_t N = B * T, I = inner_, H = heads_, D = head_dim();
  const size_t esz = dtype_size(c.dt);
  Tensor datt = c.act({N, I});
  out_.backward(c, datt.data(), dy, saved.att.data(), N);
  if (self_) {
    Tensor dqkv = c.act({N, 3 * I});
    const char* base = static_cast<const char*>(saved.q.data());
    char* dbase = static_cast<char*>(dqkv.data());
    const size_t ko = size_t(I) * esz, vo = size_t(2 * I) * esz;
    ZP_KERNEL_CALL(c.dev, attention_backward, c.s, c.dt, dbase, dbase + ko, dbase + vo, datt.data(), base,
                   base + ko, base + vo, saved.att.data(), saved.lse.data<float>(), B, T, T, H, H, D, 3 * I, 3 * I,
                   3 * I, I, attention_default_scale(D), false);
    q_.backward(c, dx, dqkv.data(), x, N, accumulate_dx);
    return;
  }
  Tensor dq = c.act({N, I}), dkv = c.act({B * L, 2 * I});
  const char* kbase = static_cast<const char*>(saved.kv.data());
  char* dkbase = static_cast<char*>(dkv.data());
  const size_t vo = size_t(I) * esz;
  ZP_KERNEL_CALL(c.dev, attention_backward, c.s, c.dt, dq.data(), dkbase, dkbase + vo, datt.data(), saved.q.data(),
                 kbase, kbase + vo, saved.att.data(), saved.lse.data<float>(), B, T, L, H, H, D, I, 2 * I, 2 * I, I,
                 attention_default_scale(D), false);
  q_.backward(c, dx, dq.data(), x, N, accumulate_dx);
  kv_.backward(c, dcontext, dkv.data(), context, B * L, accumulate_dcontext);
}

}  // namespace zp::nn
