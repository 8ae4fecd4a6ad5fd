// diffusers' Transformer2DModel, the UNet's attention layer: GroupNorm (eps 1e-6), proj_in (a 1x1
// convolution, or with use_linear_projection a linear; on channels-last images both are the same GEMM
// over the H*W tokens, and no layout move surrounds them), BasicTransformerBlocks over the tokens,
// proj_out (the mirror image), + the layer's input.
//
// Checkpointed, it keeps its input and each transformer block's input: the backward re-runs the
// last block first (its output is proj_out's input), every other block just before its backward,
// and the GroupNorm (proj_in's input) last; the proj_in and proj_out GEMMs are not re-run.
#pragma once
#include <vector>

#include "nn/basic_transformer_block.h"
#include "nn/context.h"
#include "nn/conv2d.h"
#include "nn/group_norm.h"
#include "nn/linear.h"

namespace zp::nn {

class Transformer2D {
 public:
  struct Saved {
    Tensor x;      // the input: all a checkpointed forward keeps, with the blocks' inputs
    Tensor p_in;   // proj_in's input: the normalised x, [B*HW, C]
    Tensor p_out;  // proj_out's input: the last block's output, [B*HW, I]
    GroupNorm::Saved n;
    std::vector<BasicTransformerBlock::Saved> blocks;
    bool checkpointed = false;
  };
  Transformer2D() = default;
  // 1x1 convolutions as projections (SD 1.x).
  Transformer2D(GroupNorm norm, Conv2d proj_in, std::vector<BasicTransformerBlock> blocks, Conv2d proj_out);
  // Linear projections on the tokens (use_linear_projection: SD 2.x, SDXL).
  Transformer2D(GroupNorm norm, Linear proj_in, std::vector<BasicTransformerBlock> blocks, Linear proj_out);

  // y[B, H, W, C] from x[B, H, W, C] and context[B, L, Cc]. checkpoint: keep only the inputs of the
  // layer and of its blocks.
  Tensor forward(const Ctx& c, const Tensor& x, int64_t H, int64_t W, const Tensor& context, Saved& saved,
                 bool checkpoint) const;
  // Returns the input gradient; parameter gradients accumulate, or with `later` (a split backward,
  // nn/deferred_weight_grads.h) are left in it, which then holds dy. Consumes `saved`.
  Tensor backward(const Ctx& c, const Tensor& dy, int64_t H, int64_t W, const Tensor& context, Saved& saved,
                  DeferredWeightGrads* later = nullptr) const;

 private:
  void normalise_input(const Ctx& c, int64_t B, int64_t HW, Saved& saved) const;

  GroupNorm norm_;
  bool linear_ = false;
  Conv2d proj_in_conv_, proj_out_conv_;
  Linear proj_in_lin_, proj_out_lin_;
  std::vector<BasicTransformerBlock> blocks_;
  int64_t channels_ = 0, inner_ = 0;
};

}  // namespace zp::nn
