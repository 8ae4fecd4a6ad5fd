// Fused softmax cross-entropy over a large vocabulary, straight from the (bf16) logits: no fp32 copy
// of the logits and no materialised probabilities.
//
//   logits[N, ld] (dtype dt): row n holds V real columns then ld - V padding columns (GPT-2 pads its
//   vocabulary 50257 -> 50304) that are ignored and get zero gradient.
//   targets[N] (int32): a target < 0 means "ignore this row" (loss 0, lse 0, gradient 0).
#pragma once
#include "kernels/kernel.h"

namespace zp::kernels {

// losses[n] = logsumexp(logits[n, :V]) - logits[n, target[n]]; lse[n] = the logsumexp (lse may be
// nullptr). Both fp32.
ZP_KERNEL(void cross_entropy_forward(StreamHandle s, DType dt, float* losses, float* lse, const void* logits,
                                     const int32_t* targets, int64_t N, int64_t V, int64_t ld))
// dlogits[n, c] = dloss_scale * (softmax(logits[n, :V])[c] - (c == target[n])) for valid rows and
// c < V; 0 for ignored rows and padding columns. dloss_scale = d(total loss)/d(loss_n), the same for
// every row (1/num_valid for a mean). dlogits may alias logits (in place). lse from the forward, or
// nullptr to recompute it.
ZP_KERNEL(void cross_entropy_backward(StreamHandle s, DType dt, void* dlogits, const void* logits,
                                      const float* lse, const int32_t* targets, float dloss_scale, int64_t N,
                                      int64_t V, int64_t ld))

}  // namespace zp::kernels
