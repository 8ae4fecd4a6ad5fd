// diffusers' Attention (the attn1 / attn2 of a BasicTransformerBlock): non-causal multi-head
// attention of tokens x[B, T, C] over either themselves (self-attention) or a context[B, L, Cc] of
// another width (cross-attention on the text encoder's hidden states). to_q, to_k, to_v have no bias;
// to_out.0 has one. Heads split the inner width I = heads * head_dim into consecutive slices, the
// layout the attention kernel reads in place:
//   self:  to_q, to_k, to_v packed into one [3I, C] weight, one GEMM, q/k/v read strided from its rows
//   cross: to_q alone on x, to_k and to_v packed into one [2I, Cc] weight applied to the context.
#pragma once
#include "nn/context.h"
#include "nn/linear.h"

namespace zp::nn {

class CrossAttention {
 public:
  struct Saved {
    Tensor q;    // self: [B*T, 3I] packed q|k|v; cross: [B*T, I]
    Tensor kv;   // cross: [B*L, 2I] packed k|v; empty for self-attention
    Tensor att;  // [B*T, I]: attention output before to_out
    Tensor lse;  // fp32 [B, heads, T]
  };
  CrossAttention() = default;
  // Self-attention from a packed q|k|v projection.
  CrossAttention(Linear qkv, Linear out, int64_t heads);
  // Cross-attention: q from the tokens, packed k|v from the context.
  CrossAttention(Linear q, Linear kv, Linear out, int64_t heads);

  bool is_self() const { return self_; }
  int64_t heads() const { return heads_; }
  int64_t head_dim() const { return inner_ / heads_; }

  // y[B*T, C] = attention(x[B*T, C]) over x itself (context = nullptr, L ignored) or over
  // context[B*L, Cc].
  void forward(const Ctx& c, void* y, const void* x, int64_t B, int64_t T, const void* context, int64_t L,
               Saved& saved) const;
  // Parameter gradients accumulate. dx is written (or added with accumulate_dx). dcontext, when not
  // nullptr (cross-attention only), is written or added with accumulate_dcontext.
  void backward(const Ctx& c, void* dx, void* dcontext, const void* dy, const void* x, const void* context, int64_t B,
                int64_t T, int64_t L, const Saved& saved, bool accumulate_dx, bool accumulate_dcontext) const;

 private:
  bool self_ = true;
  Linear q_, kv_, out_;  // self: q_ is the packed q|k|v projection and kv_ is unused
  int64_t heads_ = 1, inner_ = 0;
};

}  // namespace zp::nn
