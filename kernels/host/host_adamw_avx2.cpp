// AVX2 path of HostAdamW, 8 floats at a time; the last n % 8 elements go through the scalar path,
// which computes the same bits. F16C converts the f16 copy; the bf16 copy is rounded in 32-bit lanes
// and narrowed with packus. Each line mirrors one line of the reference, in its order: nothing is fused.
#include <immintrin.h>

#include "kernels/host/host_adamw.h"

#define ZP_AVX2 __attribute__((target("avx2,f16c")))

namespace zp::kernels::host::detail {
namespace {

// 8 bf16 values of p: round to nearest even, NaN kept quiet (as zp::bf16).
ZP_AVX2 inline __m128i bf16_of(__m256 p) {
  const __m256i u = _mm256_castps_si256(p);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(p, p, _CMP_UNORD_Q));
  const __m256i bits = _mm256_blendv_epi8(rounded, quiet_nan, nan);
  // Every lane is below 0x10000, so the unsigned saturation of packus never applies.
  return _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
}

template <DType kCopy> ZP_AVX2 inline void update8(const Range& r, const Consts& k, int64_t i, bool lerp_low) {
  const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(r.g + i), _mm256_set1_ps(k.grad_scale));
  __m256 p = _mm256_mul_ps(_mm256_loadu_ps(r.p + i), _mm256_set1_ps(r.decay));
  __m256 m = _mm256_loadu_ps(r.m + i);
  const __m256 g_minus_m = _mm256_sub_ps(g, m);
  m = lerp_low ? _mm256_add_ps(m, _mm256_mul_ps(_mm256_set1_ps(k.one_minus_beta1), g_minus_m))
               : _mm256_sub_ps(g, _mm256_mul_ps(g_minus_m, _mm256_set1_ps(k.one_minus_w)));
  __m256 v = _mm256_mul_ps(_mm256_loadu_ps(r.v + i), _mm256_set1_ps(k.beta2));
  v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(k.one_minus_beta2), g), g));
  const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), _mm256_set1_ps(k.bias_correction2_sqrt)),
                                     _mm256_set1_ps(k.eps));
  p = _mm256_add_ps(p, _mm256_mul_ps(_mm256_set1_ps(k.neg_step_size), _mm256_div_ps(m, denom)));
  _mm256_storeu_ps(r.p + i, p);
  _mm256_storeu_ps(r.m + i, m);
  _mm256_storeu_ps(r.v + i, v);
  if constexpr (kCopy == DType::F32) {
    _mm256_storeu_ps(static_cast<float*>(r.copy) + i, p);
  } else if constexpr (kCopy == DType::BF16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(r.copy) + i), bf16_of(p));
  } else if constexpr (kCopy == DType::F16) {
    // The hardware keeps a NaN's payload where zp::f16 writes sign | 0x7e00: NaN groups go scalar.
    uint16_t* copy16 = static_cast<uint16_t*>(r.copy) + i;
    if (_mm256_movemask_ps(_mm256_cmp_ps(p, p, _CMP_UNORD_Q)) == 0) {
      const __m128i h = _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(copy16), h);
    } else {
      for (int j = 0; j < 8; ++j) copy16[j] = f16(r.p[i + j]).bits;
    }
  }
}

template <DType kCopy> ZP_AVX2 int64_t update_body(const Range& r, const Consts& k) {
  const bool lerp_low = k.one_minus_beta1 < 0.5f;
  int64_t i = 0;
  for (; i + 8 <= r.n; i += 8) update8<kCopy>(r, k, i, lerp_low);
  return i;
}

}  // namespace

// DType::U8 stands for "no copy". Not itself AVX2 code: only update_body is.
void update_avx2(const Range& r, const Consts& k, DType copy_dt) {
  int64_t done = 0;
  if (!r.copy) done = update_body<DType::U8>(r, k);
  else if (copy_dt == DType::F32) done = update_body<DType::F32>(r, k);
  else if (copy_dt == DType::BF16) done = update_body<DType::BF16>(r, k);
  else if (copy_dt == DType::F16) done = update_body<DType::F16>(r, k);
  else ZP_FATAL("HostAdamW: copy dtype ", dtype_name(copy_dt), " is not f32, bf16 or f16");
  if (done == r.n) return;
  void* copy = r.copy ? static_cast<char*>(r.copy) + done * dtype_size(copy_dt) : nullptr;
  update_scalar({r.p + done, r.g + done, r.m + done, r.v + done, copy, r.n - done, r.decay}, k, copy_dt);
}

}  // namespace zp::kernels::host::detail
