// RMSNorm over the last dimension (Llama, Qwen2): x[N, C] -> y[N, C],
//   y = x * rstd * weight,   rstd = 1 / sqrt(mean(x^2) + eps).
// The normalised value is not rounded to dt before the weight multiply (HF rounds it once there);
// the difference is one rounding of the storage type.
#pragma once
#include "kernels/kernel.h"

namespace zp::kernels {

// weight[C] is dt; rstd[N] (fp32) is written for the backward (required).
ZP_KERNEL(void rmsnorm_forward(StreamHandle s, DType dt, void* y, float* rstd, const void* x, const void* weight,
                               int64_t N, int64_t C, float eps))
// dx is written, or accumulated (dx += ...) when accumulate_dx is set; dweight[C] (fp32) is accumulated.
ZP_KERNEL(void rmsnorm_backward(StreamHandle s, DType dt, void* dx, float* dweight, const void* dy, const void* x,
                                const void* weight, const float* rstd, int64_t N, int64_t C, bool accumulate_dx))

}  // namespace zp::kernels
