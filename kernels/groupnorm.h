// GroupNorm for channels-last activations (SD / SDXL UNet), optionally fused with the SiLU that
// follows it in every ResBlock: x[N, HW, C] with C split into G groups of C/G consecutive channels;
//   z = (x - mean[n,g]) * rstd[n,g] * weight[c] + bias[c],   y = silu ? z * sigmoid(z) : z.
// Statistics are over the C/G * HW elements of a group (biased variance).
#pragma once
#include "kernels/kernel.h"

namespace zp::kernels {

// weight[C] and bias[C] are dt (both required). mean[N*G] and rstd[N*G] (fp32) are written.
ZP_KERNEL(void groupnorm_forward(StreamHandle s, DType dt, void* y, float* mean, float* rstd, const void* x,
                                 const void* weight, const void* bias, int64_t N, int64_t C, int64_t HW, int64_t G,
                                 float eps, bool silu))
// dx is written; dweight[C] and dbias[C] (fp32) are accumulated. With silu, the pre-activation z is
// recomputed from x, mean, rstd, weight and bias, so the forward saves nothing beyond mean and rstd.
ZP_KERNEL(void groupnorm_backward(StreamHandle s, DType dt, void* dx, float* dweight, float* dbias, const void* dy,
                                  const void* x, const void* weight, const void* bias, const float* mean,
                                  const float* rstd, int64_t N, int64_t C, int64_t HW, int64_t G, bool silu))

}  // namespace zp::kernels
