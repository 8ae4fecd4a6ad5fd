// RoPE's angles and rotation, shared by rope.cu's kernels and row_linear.cu's RoPE + cache output,
// so that every kernel rotating a pair rounds exactly alike. The inverse frequencies are computed on
// the host, as the CPU reference and HF do (float32 pow), and reach the kernels by value as a
// __grid_constant__ parameter, so the device never re-derives them with its own, differently rounded
// powf.
#pragma once
#include <cmath>
#include <cstdint>

namespace zp::kernels::cuda {

constexpr int kRopeMaxHalf = 512;  // D <= 1024
struct InvFreq {
  float v[kRopeMaxHalf];
};

// inv_freq[i] = 1 / theta^(2i / D) for i < D / 2.
inline InvFreq inv_freqs(float theta, int64_t D) {
  InvFreq f{};
  for (int64_t i = 0; i < D / 2; ++i) f.v[i] = 1.0f / std::pow(theta, float(2 * i) / float(D));
  return f;
}

// The rotation of one pair by angle a (times sign = +-1), with explicit FMAs.
__device__ __forceinline__ void rotate_pair(float x1, float x2, float a, float sign, float& y1, float& y2) {
  float sn, c;
  sincosf(a, &sn, &c);
  sn *= sign;
  y1 = fmaf(x1, c, -(x2 * sn));
  y2 = fmaf(x2, c, x1 * sn);
}

}  // namespace zp::kernels::cuda
