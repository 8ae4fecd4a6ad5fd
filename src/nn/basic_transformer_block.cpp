#include "nn/basic_transformer_block.h"

#include "kernels/activation.h"
#include "kernels/elementwise.h"

namespace zp::nn {
using namespace zp::kernels;

BasicTransformerBlock::BasicTransformerBlock(Norm norm1, SelfAttention attn1, Norm norm2, CrossAttention attn2,
                                             Norm norm3, Linear ff_proj, Linear ff_out)
    : norm1_(norm1), norm2_(norm2), norm3_(norm3), attn1_(attn1), attn2_(attn2), ff_proj_(ff_proj), ff_out_(ff_out) {
  ZP_CHECK(ff_proj_.out() == 2 * ff_out_.in() && ff_proj_.in() == norm3_.width() && ff_out_.out() == norm3_.width(),
           "BasicTransformerBlock: the GEGLU feed-forward's widths disagree");
}

Tensor BasicTransformerBlock::forward(const Ctx& c, const Tensor& x, int64_t B, int64_t T, const Tensor& context,
                                      Saved& saved, bool checkpoint) const {
  const int64_t N = B * T, I = norm1_.width(), F = ff_out_.in(), L = context.size(1);
  Saved& sv = saved;
  sv = {};
  sv.x = x;
  Tensor tmp = c.act({N, I});
  sv.a1 = c.saved({N, I});
  norm1_.forward(c, sv.a1.data(), x.data(), N, sv.n1);
  attn1_.forward(c, tmp.data(), sv.a1.data(), B, T, sv.s1);
  sv.t1 = c.saved({N, I});
  ZP_KERNEL_CALL(c.dev, add, c.s, c.dt, sv.t1.data(), x.data(), tmp.data(), N * I);
  sv.a2 = c.saved({N, I});
  norm2_.forward(c, sv.a2.data(), sv.t1.data(), N, sv.n2);
  attn2_.forward(c, tmp.data(), sv.a2.data(), B, T, context.data(), L, sv.s2);
  sv.t2 = c.saved({N, I});
  ZP_KERNEL_CALL(c.dev, add, c.s, c.dt, sv.t2.data(), sv.t1.data(), tmp.data(), N * I);
  sv.a3 = c.saved({N, I});
  norm3_.forward(c, sv.a3.data(), sv.t2.data(), N, sv.n3);
  sv.pre = c.saved({N, 2 * F});
  ff_proj_.forward(c, sv.pre.data(), sv.a3.data(), N);
  sv.h = c.saved({N, F});
  ZP_KERNEL_CALL(c.dev, geglu_forward_packed, c.s, c.dt, sv.h.data(), sv.pre.data(), N, F);
  ff_out_.forward(c, tmp.data(), sv.h.data(), N);
  Tensor y = c.act({N, I});
  ZP_KERNEL_CALL(c.dev, add, c.s, c.dt, y.data(), sv.t2.data(), tmp.data(), N * I);
  if (checkpoint) {
    sv = {};
    sv.x = x;
    sv.checkpointed = true;
  }
  return y;
}

Tensor BasicTransformerBlock::recompute(const Ctx& c, int64_t B, int64_t T, const Tensor& context,
                                        Saved& saved) const {
  ZP_CHECK(saved.checkpointed, "BasicTransformerBlock: recompute() after a forward that kept everything");
  const Tensor x = saved.x;  // forward() starts by clearing saved
  return forward(c, x, B, T, context, saved, false);
}

void BasicTransformerBlock::backward(const Ctx& c, Tensor& dres, int64_t B, int64_t T, const Tensor& context,
                                     Saved& saved, DeferredWeightGrads* later) const {
  const int64_t N = B * T, I = norm1_.width(), F = ff_out_.in(), L = context.size(1);
  Saved& sv = saved;
  ZP_CHECK(!sv.checkpointed, "BasicTransformerBlock: backward of a checkpointed forward before its recompute()");
  // A split backward's W still reads each branch's output gradient: the residual gradient goes on
  // accumulating into a copy.
  auto keep_for_later = [&] {
    if (!later) return;
    Tensor next = c.act({N, I});
    next.copy_from(dres, c.s);
    dres = std::move(next);
  };
  Tensor da = c.act({N, I});
  {
    Tensor dh = c.act({N, F}), dpre = c.act({N, 2 * F});
    ff_out_.backward(c, dh.data(), dres, sv.h, N, false, later);
    ZP_KERNEL_CALL(c.dev, geglu_backward_packed, c.s, c.dt, dpre.data(), dh.data(), sv.pre.data(), N, F);
    ff_proj_.backward(c, da.data(), dpre, sv.a3, N, false, later);
  }
  keep_for_later();
  norm3_.backward(c, dres.data(), da.data(), sv.t2.data(), N, sv.n3, true, later);
  attn2_.backward(c, da.data(), nullptr, dres, sv.a2, context, B, T, L, sv.s2, false, false, later);
  keep_for_later();
  norm2_.backward(c, dres.data(), da.data(), sv.t1.data(), N, sv.n2, true, later);
  attn1_.backward(c, da.data(), dres, sv.a1, B, T, sv.s1, false, {}, later);
  keep_for_later();
  norm1_.backward(c, dres.data(), da.data(), sv.x.data(), N, sv.n1, true, later);
  sv = {};
}

}  // namespace zp::nn
