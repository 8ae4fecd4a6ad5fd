// AVX-512 path of HostAdamW, 16 floats at a time; the tail (n not a multiple of 16) runs the same code
// under a lane mask, so there is no scalar remainder. Only AVX512F instructions: the 16-bit copies are
// built in 32-bit lanes and narrowed by vpmovdw, whose masked store is AVX512F (a masked 16-bit store
// would need AVX512BW). Each line mirrors one line of the reference, in its order: nothing is fused.
#include <immintrin.h>

#include "kernels/host/host_adamw.h"

// GCC 12 warns about the deliberately undefined registers (`__m512 __Y = __Y`) inside its own intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define ZP_AVX512 __attribute__((target("avx512f")))

namespace zp::kernels::host::detail {
namespace {

// bf16 bits of p in the low half of each 32-bit lane: round to nearest even, NaN kept quiet (as zp::bf16).
ZP_AVX512 inline __m512i bf16_bits(__m512 p) {
  const __m512i u = _mm512_castps_si512(p);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q), quiet_nan);
}

// f16 bits of p in 32-bit lanes: the hardware conversion rounds to nearest even; a NaN becomes the
// sign with 0x7e00, as zp::f16 writes it (the hardware keeps the payload).
ZP_AVX512 inline __m512i f16_bits(__m512 p) {
  const __m512i h = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(p), 16), _mm512_set1_epi32(0x8000));
  const __m512i nan = _mm512_or_si512(sign, _mm512_set1_epi32(0x7e00));
  return _mm512_mask_mov_epi32(h, _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q), nan);
}

// One group of up to 16 elements at offset i; lanes outside `mask` are neither read nor written.
template <DType kCopy>
ZP_AVX512 inline void update16(const Range& r, const Consts& k, int64_t i, __mmask16 mask, bool lerp_low) {
  const __m512 g = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, r.g + i), _mm512_set1_ps(k.grad_scale));
  __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, r.p + i), _mm512_set1_ps(r.decay));
  __m512 m = _mm512_maskz_loadu_ps(mask, r.m + i);
  const __m512 g_minus_m = _mm512_sub_ps(g, m);
  m = lerp_low ? _mm512_add_ps(m, _mm512_mul_ps(_mm512_set1_ps(k.one_minus_beta1), g_minus_m))
               : _mm512_sub_ps(g, _mm512_mul_ps(g_minus_m, _mm512_set1_ps(k.one_minus_w)));
  __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, r.v + i), _mm512_set1_ps(k.beta2));
  v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(k.one_minus_beta2), g), g));
  const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), _mm512_set1_ps(k.bias_correction2_sqrt)),
                                     _mm512_set1_ps(k.eps));
  p = _mm512_add_ps(p, _mm512_mul_ps(_mm512_set1_ps(k.neg_step_size), _mm512_div_ps(m, denom)));
  _mm512_mask_storeu_ps(r.p + i, mask, p);
  _mm512_mask_storeu_ps(r.m + i, mask, m);
  _mm512_mask_storeu_ps(r.v + i, mask, v);
  if constexpr (kCopy == DType::F32) _mm512_mask_storeu_ps(static_cast<float*>(r.copy) + i, mask, p);
  uint16_t* copy16 = static_cast<uint16_t*>(r.copy);
  if constexpr (kCopy == DType::BF16) _mm512_mask_cvtepi32_storeu_epi16(copy16 + i, mask, bf16_bits(p));
  if constexpr (kCopy == DType::F16) _mm512_mask_cvtepi32_storeu_epi16(copy16 + i, mask, f16_bits(p));
}

template <DType kCopy> ZP_AVX512 void update_range(const Range& r, const Consts& k) {
  const bool lerp_low = k.one_minus_beta1 < 0.5f;
  int64_t i = 0;
  for (; i + 16 <= r.n; i += 16) update16<kCopy>(r, k, i, 0xffff, lerp_low);
  if (i < r.n) update16<kCopy>(r, k, i, __mmask16((1u << (r.n - i)) - 1), lerp_low);
}

}  // namespace

// DType::U8 stands for "no copy". Not itself AVX-512 code: only update_range is.
void update_avx512(const Range& r, const Consts& k, DType copy_dt) {
  if (!r.copy) return update_range<DType::U8>(r, k);
  switch (copy_dt) {
    case DType::F32: return update_range<DType::F32>(r, k);
    case DType::BF16: return update_range<DType::BF16>(r, k);
    case DType::F16: return update_range<DType::F16>(r, k);
    default: ZP_FATAL("HostAdamW: copy dtype ", dtype_name(copy_dt), " is not f32, bf16 or f16");
  }
}

}  // namespace zp::kernels::host::detail
