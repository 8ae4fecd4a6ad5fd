// diffusers' BasicTransformerBlock, the layer inside a Transformer2D, on tokens x[B*T, I]:
// self-attention over the tokens (nn::SelfAttention, bidirectional), cross-attention over the text
// context (nn::CrossAttention), and a GEGLU feed-forward, each after a LayerNorm and added to the
// residual stream.
#pragma once
#include "nn/attention.h"
#include "nn/context.h"
#include "nn/cross_attention.h"
#include "nn/linear.h"
#include "nn/norm.h"

namespace zp::nn {

class BasicTransformerBlock {
 public:
  struct Saved {
    Tensor x;  // the input: all a checkpointed forward keeps
    Tensor a1, t1, a2, t2, a3, pre, h;  // norm outputs a*, residual stream t*, GEGLU input and output
    Norm::Saved n1, n2, n3;
    SelfAttention::Saved s1;
    CrossAttention::Saved s2;
    bool checkpointed = false;  // only x: recompute() re-runs the forward before the backward
  };
  BasicTransformerBlock() = default;
  // ff_proj: ff.net.0.proj, [2F, I] with the GEGLU's value rows before its gate rows; ff_out: ff.net.2.
  BasicTransformerBlock(Norm norm1, SelfAttention attn1, Norm norm2, CrossAttention attn2, Norm norm3, Linear ff_proj,
                        Linear ff_out);

  // y[B*T, I] from x[B*T, I] and context[B, L, Cc]. checkpoint: keep only x.
  Tensor forward(const Ctx& c, const Tensor& x, int64_t B, int64_t T, const Tensor& context, Saved& saved,
                 bool checkpoint) const;
  // After a checkpointed forward: everything the backward needs, again. Returns the output.
  Tensor recompute(const Ctx& c, int64_t B, int64_t T, const Tensor& context, Saved& saved) const;
  // dres holds the output gradient on entry and the input gradient on return: each branch's input
  // gradient is added into it on the way down. Parameter gradients accumulate, or with `later` (a
  // split backward, nn/deferred_weight_grads.h) are left in it. Consumes `saved` (after recompute()
  // when the forward was checkpointed).
  void backward(const Ctx& c, Tensor& dres, int64_t B, int64_t T, const Tensor& context, Saved& saved,
                DeferredWeightGrads* later = nullptr) const;

 private:
  Norm norm1_, norm2_, norm3_;
  SelfAttention attn1_;
  CrossAttention attn2_;
  Linear ff_proj_, ff_out_;
};

}  // namespace zp::nn
