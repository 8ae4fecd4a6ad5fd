// Scaled dot-product attention with grouped-query heads, in the token-major layout a fused qkv
// projection produces, so q, k and v may be strided views into one packed [B, T, (Hq+2Hkv)*D] buffer.
//
//   q[B, Tq, Hq, D], k[B, Tk, Hkv, D], v[B, Tk, Hkv, D], out[B, Tq, Hq, D] (dtype dt)
//   element (b, t, h, d) of q lives at q[(b*Tq + t) * q_stride + h*D + d]; likewise k, v, out with
//   their own strides (elements between consecutive tokens; 0 means contiguous: Hq*D or Hkv*D).
//   Query head h reads kv head h / (Hq / Hkv); Hq % Hkv == 0.
//   lse[B, Hq, Tq] (fp32) = logsumexp over visible keys of scale * q.k, saved for the backward.
//   causal: key j is visible to query i iff j <= i + (Tk - Tq) (bottom-right aligned; Tq == Tk gives
//   the usual mask). A query that sees no key at all (causal with Tq > Tk) gets out = 0, lse = -inf
//   and zero gradients.
//   segments (optional, on the device q is on; nullptr = none): int32 [B, T] with Tq == Tk == T,
//   for several sequences packed into one row. Key j is visible to query i only if, besides the causal
//   rule, segments[b*T + i] == segments[b*T + j]. Ids are arbitrary int32 values; equal ids need not be
//   adjacent, though the CUDA kernels skip whole key tiles only when ids are sorted or clustered (they
//   compare per-tile min/max). A negative id is not special: padding tokens given id -1 form one more
//   segment of their own, which keeps them out of every real sequence (the caller masks their loss).
//   With segments every query sees at least itself, so none gets lse = -inf.
#pragma once
#include <cmath>

#include "kernels/kernel.h"

namespace zp::kernels {

// The usual softmax temperature, 1/sqrt(D).
inline float attention_default_scale(int64_t D) { return float(1.0 / std::sqrt(double(D))); }

ZP_KERNEL(void attention_forward(StreamHandle s, DType dt, void* out, float* lse, const void* q, const void* k,
                                 const void* v, int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv,
                                 int64_t D, int64_t q_stride, int64_t k_stride, int64_t v_stride,
                                 int64_t o_stride, float scale, bool causal, const int32_t* segments = nullptr))
// dq, dk, dv are written (not accumulated), with the strides of q, k, v respectively, so they may be
// views into one packed dqkv buffer. dk and dv sum over the query heads that share a kv head.
// dout has the stride of out.
ZP_KERNEL(void attention_backward(StreamHandle s, DType dt, void* dq, void* dk, void* dv, const void* dout,
                                  const void* q, const void* k, const void* v, const void* out,
                                  const float* lse, int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv,
                                  int64_t D, int64_t q_stride, int64_t k_stride, int64_t v_stride,
                                  int64_t o_stride, float scale, bool causal,
                                  const int32_t* segments = nullptr))

#ifdef ZP_WITH_CUDA
namespace cuda {
// True when the CUDA attention_forward / attention_backward take the tensor-core flash path
// (kernels/cuda/flash_attention.cu) for this dtype, head dim and row strides (0 = contiguous) on the
// current device: bf16 or f16, D in {40, 64, 80, 128, 160}, strides multiples of 8 elements, sm_80 or newer.
// The call itself also needs 16-byte aligned pointers and scale > 0; otherwise, and for everything
// else, the general fp32-tile kernels run.
bool attention_uses_flash(DType dt, int64_t D, int64_t q_stride, int64_t k_stride, int64_t v_stride,
                          int64_t o_stride);
}  // namespace cuda
#endif

}  // namespace zp::kernels
