// diffusers' ResnetBlock2D, the UNet's convolutional layer: norm1 + SiLU, conv1, + time_emb_proj(temb)
// per channel, norm2 + SiLU, conv2, (a 1x1 conv_shortcut when the width changes), then
// (shortcut + h) / output_scale_factor. An up block's resnet reads its input concatenated with a
// skip connection (torch.cat(dim=1)); the concatenation happens here, so that a checkpointed block
// keeps the two halves, which exist anyway, rather than their concatenation, and the backward hands
// back the two halves' gradients.
#pragma once
#include "nn/context.h"
#include "nn/conv2d.h"
#include "nn/group_norm.h"
#include "nn/linear.h"

namespace zp::nn {

class ResBlock {
 public:
  struct Saved {
    Tensor in, skip;        // the forward's arguments: all a checkpointed forward keeps
    Tensor x, a1, h1, a2;   // x: the input, [in | skip] along channels with a skip
    GroupNorm::Saved n1, n2;
    int64_t skip_channels = 0;  // Cs: where the backward splits the input gradient
    bool checkpointed = false;  // only in and skip: the backward re-runs the forward first
  };
  ResBlock() = default;
  // shortcut: undefined when the input and output widths agree. output_scale: output_scale_factor.
  ResBlock(GroupNorm norm1, Conv2d conv1, Linear time_emb_proj, GroupNorm norm2, Conv2d conv2, Conv2d shortcut,
           float output_scale);

  int64_t in_channels() const { return conv1_.in(); }
  int64_t out_channels() const { return conv1_.out(); }

  // y[B, H, W, Cout] from in[B, H, W, Ci] (followed along channels by skip[B, H, W, Cs] when it is
  // defined; Ci + Cs = in_channels()) and the time embedding temb[B, T]. checkpoint: keep only in and
  // skip.
  Tensor forward(const Ctx& c, const Tensor& in, const Tensor& skip, int64_t H, int64_t W, const Tensor& temb,
                 Saved& saved, bool checkpoint) const;
  // Returns the gradient of `in`; with a skip, its gradient goes to *dskip. temb's gradient
  // accumulates into dtemb [B, T], parameter gradients into their buffers, or with `later` (a split
  // backward, nn/deferred_weight_grads.h) they are left in it, which then holds dy. Consumes `saved`.
  Tensor backward(const Ctx& c, const Tensor& dy, int64_t H, int64_t W, const Tensor& temb, Tensor& dtemb,
                  Saved& saved, Tensor* dskip = nullptr, DeferredWeightGrads* later = nullptr) const;

 private:
  GroupNorm norm1_, norm2_;
  Conv2d conv1_, conv2_, shortcut_;
  Linear temb_proj_;
  float out_scale_ = 1.f;
};

}  // namespace zp::nn
