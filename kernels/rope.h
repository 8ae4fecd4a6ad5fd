// Rotary position embedding (RoPE) as Hugging Face Llama / Qwen2 apply it, "rotate_half" convention:
// channel i of a head is paired with channel i + D/2 (not with i + 1 as in the interleaved GPT-J form).
// For position p and i < D/2, with a = p * inv_freq[i]:
//   y[i]       = x[i] cos a - x[i + D/2] sin a
//   y[i + D/2] = x[i + D/2] cos a + x[i] sin a
// Angles follow HF exactly, in float32: inv_freq[i] = 1 / theta^(float(2i) / D), a = float(p) * inv_freq[i],
// cos and sin of that float angle rounded to float. (At long positions an angle computed in double
// differs from HF's by far more than parity tolerances allow.) HF then casts cos/sin to the activation
// dtype and rotates in it; we keep them in fp32, like every other op here.
//
// x, y: [B, T, H, D] (q or k before the attention transpose); token t has position pos_offset + t
// (pos_offset > 0 when generating with a KV cache). y may alias x (in place). D is even, at most 1024.
// row_stride: elements between consecutive tokens (0 = H * D), so the q and k heads can be rotated in
// place inside a packed [q | k | v] projection row.
// positions (optional, same device as x; nullptr = pos_offset + t): int32 [B, T], the position of each
// token, for several sequences packed into one row whose positions each restart at 0; pos_offset must
// then be 0 (a position is never the sum of both, which would hide a caller's mix-up).
#pragma once
#include "kernels/kernel.h"

namespace zp::kernels {

ZP_KERNEL(void rope_forward(StreamHandle s, DType dt, void* y, const void* x, int64_t B, int64_t T, int64_t H,
                            int64_t D, float theta, int64_t pos_offset, int64_t row_stride = 0,
                            const int32_t* positions = nullptr))
// dx = the inverse (transposed) rotation of dy. dx may alias dy.
ZP_KERNEL(void rope_backward(StreamHandle s, DType dt, void* dx, const void* dy, int64_t B, int64_t T, int64_t H,
                             int64_t D, float theta, int64_t pos_offset, int64_t row_stride = 0,
                             const int32_t* positions = nullptr))

// A decode step's two kernels in one: rope_forward on the q and k heads of N packed [q | k | v]
// projection rows (in place; row_stride = the row width, positions int32 [N], required), then
// kv_cache_write (kernels/paged_attention.h) of the rotated keys and the values to their slots. The
// same numbers as those two calls, which are its definition and its CPU reference.
ZP_KERNEL(void rope_kv_cache_write(StreamHandle s, DType dt, void* qkv, int64_t N, int64_t Hq, int64_t Hkv, int64_t D,
                                   int64_t row_stride, float theta, const int32_t* positions, void* k_cache,
                                   void* v_cache, const int32_t* slots, int64_t block_size))

}  // namespace zp::kernels
