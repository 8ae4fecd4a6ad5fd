// LayerNorm over the last dimension (GPT-2, SD transformer blocks): x[N, C] -> y[N, C],
//   y = (x - mean) * rstd * weight + bias,   rstd = 1 / sqrt(var + eps)   (biased variance).
#pragma once
#include "kernels/kernel.h"

namespace zp::kernels {

// weight[C] and bias[C] are dt; bias may be nullptr (no bias). mean[N] and rstd[N] are written for
// the backward (both required).
ZP_KERNEL(void layernorm_forward(StreamHandle s, DType dt, void* y, float* mean, float* rstd, const void* x,
                                 const void* weight, const void* bias, int64_t N, int64_t C, float eps))
// dx is written, or accumulated (dx += ...) when accumulate_dx is set (residual streams).
// dweight[C] and dbias[C] are fp32 and accumulated; dbias may be nullptr (no bias).
ZP_KERNEL(void layernorm_backward(StreamHandle s, DType dt, void* dx, float* dweight, float* dbias, const void* dy,
                                  const void* x, const void* weight, const float* mean, const float* rstd,
                                  int64_t N, int64_t C, bool accumulate_dx))

}  // namespace zp::kernels
