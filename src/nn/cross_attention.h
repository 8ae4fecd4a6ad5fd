// Cross-attention (the attn2 of diffusers' BasicTransformerBlock): non-causal multi-head attention of
// tokens x[B, T, C] over a context[B, L, Cc] of another length and width (the text encoder's hidden
// states). to_q on x and to_k, to_v packed into one [2I, Cc] weight on the context, neither with a
// bias; to_out.0 has one. Heads split the inner width I = heads * head_dim into consecutive slices,
// the layout the attention kernel reads in place.
//
// Why a module of its own rather than a mode of nn::SelfAttention (which serves attn1): the queries
// and the keys come from different inputs, so there are two projections where self-attention packs
// one, the key length L is not the query length T, and the backward has a second input gradient
// (the context's, for training the text encoder).
#pragma once
#include "nn/context.h"
#include "nn/linear.h"

namespace zp::nn {

class DeferredWeightGrads;

class CrossAttention {
 public:
  struct Saved {
    Tensor q;    // [B*T, I]
    Tensor kv;   // [B*L, 2I] packed k|v
    Tensor att;  // [B*T, I]: attention output before to_out
    Tensor lse;  // fp32 [B, heads, T]
  };
  CrossAttention() = default;
  // q from the tokens, packed k|v from the context.
  CrossAttention(Linear q, Linear kv, Linear out, int64_t heads);

  int64_t heads() const { return heads_; }
  int64_t head_dim() const { return inner_ / heads_; }

  // y[B*T, C] = attention(x[B*T, C]) over context[B*L, Cc].
  void forward(const Ctx& c, void* y, const void* x, int64_t B, int64_t T, const void* context, int64_t L,
               Saved& saved) const;
  // Parameter gradients accumulate, or with `later` (a split backward, nn/deferred_weight_grads.h)
  // are left in it, which then holds dy, x, the context and this backward's own buffers. dx is
  // written (or added with accumulate_dx). dcontext, when not nullptr, is written or added with
  // accumulate_dcontext.
  void backward(const Ctx& c, void* dx, void* dcontext, const Tensor& dy, const Tensor& x, const Tensor& context,
                int64_t B, int64_t T, int64_t L, const Saved& saved, bool accumulate_dx, bool accumulate_dcontext,
                DeferredWeightGrads* later = nullptr) const;

 private:
  Linear q_, kv_, out_;
  int64_t heads_ = 1, inner_ = 0;
};

}  // namespace zp::nn
