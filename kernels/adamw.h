// Fused multi-tensor AdamW step on fp32 master weights, in torch.optim.AdamW's order of operations:
//   g = grad * grad_scale
//   p *= 1 - lr * weight_decay                          (decoupled weight decay)
//   m = lerp(m, g, 1 - beta1)
//   v = v * beta2 + (1 - beta2) * g * g
//   p += -(lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// and, when param_copy is set, param_copy = p rounded to copy_dt (the compute copy, e.g. bf16).
// One call updates every tensor in the list (a single launch per 48 tensors on CUDA). On CUDA every
// pointer is device memory; the AdamWTensor array itself is host memory.
#pragma once
#include "kernels/kernel.h"

namespace zp::kernels {

struct AdamWTensor {
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  void* param_copy = nullptr;  // optional copy of the updated param in copy_dt; nullptr = none
  int64_t n = 0;
  float weight_decay = 0.f;
};

// Scalars are double, as in torch, so derived constants (1 - beta1, lr / bias_correction1, ...) are
// computed in double and rounded to float once.
struct AdamWConfig {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  int64_t step = 1;         // 1-based, already incremented for this update (bias correction)
  float grad_scale = 1.f;   // grads are multiplied by this first (clipping, loss-scale unscaling)
};

ZP_KERNEL(void adamw_step(StreamHandle s, const AdamWTensor* tensors, int count, const AdamWConfig& cfg,
                          DType copy_dt))

}  // namespace zp::kernels
