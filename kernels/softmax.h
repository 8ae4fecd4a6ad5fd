// Row softmax over the last dimension: y[N, C] = softmax(scale * x) per row.
//
// causal_T > 0 treats the rows as stacked [T, T] score matrices (row r is query r % T): column c is
// visible to row r iff c <= r % T, and masked entries of y are 0. causal_T = 0 means no mask.
#pragma once
#include "kernels/kernel.h"

namespace zp::kernels {

// y = softmax(scale * x) per row (in place allowed: y == x).
ZP_KERNEL(void softmax_forward(StreamHandle s, DType dt, void* y, const void* x, int64_t N, int64_t C,
                               float scale, int64_t causal_T))
// dx = scale * y * (dy - sum_c(dy * y)) per row, from the forward output y (written; dx may alias dy).
// Masked entries have y = 0, so they get dx = 0 without knowing the mask.
ZP_KERNEL(void softmax_backward(StreamHandle s, DType dt, void* dx, const void* dy, const void* y, int64_t N,
                                int64_t C, float scale))

}  // namespace zp::kernels
