// A split backward's weight-gradient half (ZB-H1, issue 12). The zero-bubble schedule splits a
// layer's backward into B, the input gradient the stage before waits for, and W, the weight
// gradients nothing waits for, run later to fill the pipeline's idle time. A module's backward given
// one of these computes its input gradient and leaves here what W needs:
//   - each Linear's backward_params (dW += dy^T x, db += colsum dy), and each Conv2d's (its filter
//     and bias gradients), with the output gradient dy and the input x it reads, held by handle (the
//     forward's saved tensors, or the backward's own buffers, which then outlive it): so the caller
//     must not overwrite them before W;
//   - the norms' (LayerNorm, RMSNorm, GroupNorm) weight (and bias) gradients: the norm backward
//     computes them with its input gradient in one kernel, so B computes them into fp32 scratch here and W adds them in.
// So B writes no gradient buffer of the module's block: the block's gradients are acquired, and
// under ZeRO-2/3 reduce-scattered, once per micro-batch, by W. The object is the caller's (a
// micro-batch's state, DESIGN decision 11); the modules keep nothing.
#pragma once
#include <vector>

#include "nn/context.h"
#include "nn/conv2d.h"
#include "nn/linear.h"

namespace zp::nn {

class DeferredWeightGrads {
 public:
  // l.backward_params(dy, x) at W; dy [N, l.out()] and x [N, l.in()] in the compute dtype. A Linear
  // with LoRA adapters is not deferred (its adapters' gradients need their values).
  void linear(const Linear& l, Tensor dy, Tensor x, int64_t N);
  // l.backward_params(dy, x, N, H, W) at W; dy [N, OH, OW, Cout] and x [N, H, W, Cin]. A Conv2d with
  // a LoRA adapter is not deferred.
  void conv(const Conv2d& l, Tensor dy, Tensor x, int64_t N, int64_t H, int64_t W);
  // Zeroed fp32 scratch for a norm's weight gradient [width] (and, with `bias`, its bias gradient
  // [width] after it), added into w's (and b's) gradient at W.
  float* norm(Parameter* w, Parameter* b, int64_t width, const Ctx& c);
  bool empty() const { return linears_.empty() && convs_.empty() && norms_.empty(); }
  // Accumulates everything into the parameters' gradient buffers (bound: the caller holds the block's
  // gradients) on c's stream, in the order it was left, and frees what it held.
  void run(const Ctx& c);

 private:
  struct LinearGrad {
    const Linear* linear;
    Tensor dy, x;
    int64_t N;
  };
  struct ConvGrad {
    const Conv2d* conv;
    Tensor dy, x;
    int64_t N, H, W;
  };
  struct NormGrad {
    Parameter *w, *b;
    Tensor grads;  // fp32 [width] or [2 width]
  };
  std::vector<LinearGrad> linears_;
  std::vector<ConvGrad> convs_;
  std::vector<NormGrad> norms_;
};

}  // namespace zp::nn
