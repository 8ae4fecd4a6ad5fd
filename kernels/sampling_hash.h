// The counter-based hash behind sampling_uniform, in one place so the CPU reference and the CUDA
// kernel draw with the same bits: splitmix64's finaliser (a bijection of 64 bits) applied to the seed,
// then to the mixed seed plus the draw counter. The counter needs no state between calls, and
// consecutive draws of one seed land on unrelated values because the second mix scrambles the sum.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define ZP_SAMPLING_HD __host__ __device__
#else
#define ZP_SAMPLING_HD
#endif

namespace zp::kernels {

ZP_SAMPLING_HD inline uint64_t sampling_mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The top 53 bits as a double in [0, 1): every value is exact, and 1 is never reached.
ZP_SAMPLING_HD inline double sampling_uniform_bits(uint64_t seed, uint64_t draw) {
  const uint64_t h = sampling_mix64(sampling_mix64(seed) + draw);
  return double(h >> 11) * 0x1.0p-53;
}

}  // namespace zp::kernels
