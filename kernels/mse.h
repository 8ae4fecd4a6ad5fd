// Per-sample weighted mean squared error, the diffusion training loss: predictions in the compute
// dtype, targets and weights in fp32 (targets are built on the host in fp32, so a bf16 model is
// never scored against a bf16-rounded target). pred/target hold B samples of n elements each.
#pragma once
#include "kernels/kernel.h"

namespace zp::kernels {

// losses[b] = weight[b] * mean_i (pred[b, i] - target[b, i])^2 (fp32, one value per sample).
// weight may be nullptr (all ones). On CUDA every pointer is a device pointer.
ZP_KERNEL(void mse_forward(StreamHandle s, DType dt, float* losses, const void* pred, const float* target,
                           const float* weight, int64_t B, int64_t n))
// The gradient of scale * mean_b losses[b]:
//   dpred[b, i] = scale * 2 * weight[b] * (pred[b, i] - target[b, i]) / (B * n)   (written).
// dpred may alias pred.
ZP_KERNEL(void mse_backward(StreamHandle s, DType dt, void* dpred, const void* pred, const float* target,
                            const float* weight, float scale, int64_t B, int64_t n))

}  // namespace zp::kernels
