#include "nn/transformer2d.h"

#include "kernels/elementwise.h"

namespace zp::nn {
using namespace zp::kernels;

Transformer2D::Transformer2D(GroupNorm norm, Conv2d proj_in, std::vector<BasicTransformerBlock> blocks,
                             Conv2d proj_out)
    : norm_(norm), linear_(false), proj_in_conv_(proj_in), proj_out_conv_(proj_out), blocks_(std::move(blocks)),
      channels_(proj_in.in()), inner_(proj_in.out()) {
  ZP_CHECK(!blocks_.empty() && norm_.channels() == channels_ && proj_out.in() == inner_ && proj_out.out() == channels_,
           "Transformer2D: the widths of its projections disagree");
}

Transformer2D::Transformer2D(GroupNorm norm, Linear proj_in, std::vector<BasicTransformerBlock> blocks,
                             Linear proj_out)
    : norm_(norm), linear_(true), proj_in_lin_(proj_in), proj_out_lin_(proj_out), blocks_(std::move(blocks)),
      channels_(proj_in.in()), inner_(proj_in.out()) {
  ZP_CHECK(!blocks_.empty() && norm_.channels() == channels_ && proj_out.in() == inner_ && proj_out.out() == channels_,
           "Transformer2D: the widths of its projections disagree");
}

// saved.n and saved.p_in from saved.x. Channels-last, the normalised image is already the tokens.
void Transformer2D::normalise_input(const Ctx& c, int64_t B, int64_t HW, Saved& saved) const {
  saved.p_in = c.saved({B * HW, channels_});
  norm_.forward(c, saved.p_in.data(), saved.x.data(), B, HW, saved.n);
}

Tensor Transformer2D::forward(const Ctx& c, const Tensor& x, int64_t H, int64_t W, const Tensor& context,
                              Saved& saved, bool checkpoint) const {
  const int64_t B = x.size(0), HW = H * W, C = channels_, I = inner_;
  Saved& sv = saved;
  sv = {};
  sv.x = x;
  sv.blocks.resize(blocks_.size());
  normalise_input(c, B, HW, sv);
  Tensor t = c.act({B * HW, I});
  if (linear_)
    proj_in_lin_.forward(c, t.data(), sv.p_in.data(), B * HW);
  else
    proj_in_conv_.forward(c, t.data(), sv.p_in.data(), B, H, W);
  for (size_t i = 0; i < blocks_.size(); ++i) t = blocks_[i].forward(c, t, B, HW, context, sv.blocks[i], checkpoint);
  sv.p_out = t;
  Tensor y = c.act({B, H, W, C});
  if (linear_)
    proj_out_lin_.forward(c, y.data(), sv.p_out.data(), B * HW);
  else
    proj_out_conv_.forward(c, y.data(), sv.p_out.data(), B, H, W);
  ZP_KERNEL_CALL(c.dev, add, c.s, c.dt, y.data(), y.data(), x.data(), y.numel());
  if (checkpoint) {
    sv.p_in = sv.p_out = Tensor();
    sv.n = {};
    sv.checkpointed = true;
  }
  return y;
}

Tensor Transformer2D::backward(const Ctx& c, const Tensor& dy, int64_t H, int64_t W, const Tensor& context,
                               Saved& saved, DeferredWeightGrads* later) const {
  const int64_t B = dy.size(0), HW = H * W, C = channels_, I = inner_;
  Saved& sv = saved;
  const bool recompute = sv.checkpointed;
  if (recompute) sv.p_out = blocks_.back().recompute(c, B, HW, context, sv.blocks.back());
  Tensor dt = c.act({B * HW, I});
  if (linear_)
    proj_out_lin_.backward(c, dt.data(), dy, sv.p_out, B * HW, false, later);
  else
    proj_out_conv_.backward(c, dt.data(), dy, sv.p_out, B, H, W, false, later);
  sv.p_out = Tensor();
  for (size_t i = blocks_.size(); i-- > 0;) {
    if (recompute && i + 1 < blocks_.size()) blocks_[i].recompute(c, B, HW, context, sv.blocks[i]);
    blocks_[i].backward(c, dt, B, HW, context, sv.blocks[i], later);
  }
  if (recompute) normalise_input(c, B, HW, sv);
  Tensor da = c.act({B, H, W, C});
  if (linear_)
    proj_in_lin_.backward(c, da.data(), dt, sv.p_in, B * HW, false, later);
  else
    proj_in_conv_.backward(c, da.data(), dt, sv.p_in, B, H, W, false, later);
  Tensor dx = c.act({B, H, W, C});
  norm_.backward(c, dx.data(), da.data(), sv.x.data(), B, HW, sv.n, later);
  ZP_KERNEL_CALL(c.dev, add, c.s, c.dt, dx.data(), dx.data(), dy.data(), dx.numel());
  sv = {};
  return dx;
}

}  // namespace zp::nn
