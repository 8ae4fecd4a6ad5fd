// RoPE (angles and rotation in rope.cuh). Each thread owns one (token, head, pair i)
// and computes its own sincosf: a thread that looped over the heads serialised H dependent loads (y
// may alias x), which left a decode step's one-token rotation latency-bound at 40 round trips (18 us
// on an H200); the recomputed sines are cheap next to the memory traffic. Consecutive threads take
// consecutive i, so both halves of each head are read and written coalesced. With explicit positions
// (packed sequences) the thread reads its token's position instead of deriving it from t.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/rope.h"

namespace zp::kernels::cuda {
namespace {

// I: the index type of the (token, head, pair) enumeration, 32-bit when it fits (64-bit division
// would cost more than the rotation).
template <class T, class I>
__global__ void rope_kernel(T* y, const T* x, I BT, I T_, I H, I D, int64_t pos_offset, int64_t row_stride,
                            const int32_t* __restrict__ positions, float sign, const __grid_constant__ InvFreq inv_freq) {
  pdl_launch_dependents();  // the next kernel of a decode step may start (cuda_common.cuh)
  pdl_wait();               // launched as a dependent of the kernel ahead (launch_dependent)
  const I half = D / 2, per_token = H * half, total = BT * per_token;
  for (I p = blockIdx.x * I(blockDim.x) + threadIdx.x; p < total; p += I(gridDim.x) * blockDim.x) {
    const I bt = p / per_token, r = p - bt * per_token, h = r / half, i = r - h * half, t = bt % T_;
    const int64_t pos = positions ? int64_t(positions[bt]) : pos_offset + t;
    const int64_t off = int64_t(bt) * row_stride + int64_t(h) * D + i;
    float y1, y2;
    rotate_pair(to_f(x[off]), to_f(x[off + half]), float(pos) * inv_freq.v[i], sign, y1, y2);
    y[off] = from_f<T>(y1);
    y[off + half] = from_f<T>(y2);
  }
}

// Blocks of 256 threads for `total` items, capped (the kernels stride over the rest).
unsigned grid_for(int64_t total) {
  const int64_t blocks = (total + 255) / 256;
  return unsigned(blocks < 65535 * 8 ? blocks : 65535 * 8);
}

void rope_apply(StreamHandle s, DType dt, void* y, const void* x, int64_t B, int64_t T, int64_t H, int64_t D,
                float theta, int64_t pos_offset, int64_t row_stride, const int32_t* positions, float sign) {
  ZP_CHECK(B >= 0 && T >= 0 && H >= 0 && D > 0 && D % 2 == 0 && D / 2 <= kRopeMaxHalf, "B=", B, " T=", T, " H=", H,
           " D=", D);
  ZP_CHECK(theta > 0 && pos_offset >= 0, "theta=", theta, " pos_offset=", pos_offset);
  ZP_CHECK(!positions || pos_offset == 0, "rope: pos_offset ", pos_offset, " together with explicit positions");
  const int64_t half = D / 2, total = B * T * H * half;
  if (total == 0) return;
  const InvFreq inv_freq = inv_freqs(theta, D);
  const unsigned grid = grid_for(total);
  ZP_CUDA_DISPATCH_FLOAT(dt, E, [&] {
    if (total < (int64_t(1) << 31) - int64_t(grid) * 256)
      launch_dependent(rope_kernel<E, uint32_t>, dim3(grid), dim3(256), 0, s, static_cast<E*>(y), static_cast<const E*>(x), uint32_t(B * T),
                                                    uint32_t(T), uint32_t(H), uint32_t(D), pos_offset, row_stride,
                                                    positions, sign, inv_freq);
    else
      launch_dependent(rope_kernel<E, int64_t>, dim3(grid), dim3(256), 0, s, static_cast<E*>(y), static_cast<const E*>(x), B * T, T, H, D,
                                                   pos_offset, row_stride, positions, sign, inv_freq);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

// rope_kv_cache_write: the rotation above over the q and k heads of each packed row, a rotated key
// pair also stored to the key cache, and then one more item per value pair, copied to the value cache.
template <class T, class I>
__global__ void rope_kv_cache_kernel(T* qkv, I N, I Hq, I Hkv, I D, int64_t row_stride,
                                     const int32_t* __restrict__ positions, T* __restrict__ kc, T* __restrict__ vc,
                                     const int32_t* __restrict__ slots, const __grid_constant__ InvFreq inv_freq) {
  pdl_launch_dependents();
  pdl_wait();
  const I half = D / 2, rotated = (Hq + Hkv) * half, per_token = rotated + Hkv * half, total = N * per_token;
  for (I p = blockIdx.x * I(blockDim.x) + threadIdx.x; p < total; p += I(gridDim.x) * blockDim.x) {
    const I n = p / per_token, r = p - n * per_token;
    const int32_t slot = slots[n];
    T* row = qkv + int64_t(n) * row_stride;
    if (r < rotated) {
      const I h = r / half, i = r - h * half;
      const int64_t off = int64_t(h) * D + i;
      float f1, f2;
      rotate_pair(to_f(row[off]), to_f(row[off + half]), float(positions[n]) * inv_freq.v[i], 1.f, f1, f2);
      const T y1 = from_f<T>(f1), y2 = from_f<T>(f2);
      row[off] = y1;
      row[off + half] = y2;
      if (h >= Hq && slot >= 0) {
        T* k = kc + (int64_t(slot) * Hkv + (h - Hq)) * D + i;
        k[0] = y1;
        k[half] = y2;
      }
    } else if (slot >= 0) {
      const I j = r - rotated, h = j / half, i = j - h * half;
      const T* v = row + (int64_t(Hq + Hkv) + h) * D + i;
      T* out = vc + (int64_t(slot) * Hkv + h) * D + i;
      out[0] = v[0];
      out[half] = v[half];
    }
  }
}

}  // namespace

void rope_kv_cache_write(StreamHandle s, DType dt, void* qkv, int64_t N, int64_t Hq, int64_t Hkv, int64_t D,
                         int64_t row_stride, float theta, const int32_t* positions, void* k_cache, void* v_cache,
                         const int32_t* slots, int64_t block_size) {
  ZP_CHECK(N >= 0 && Hq > 0 && Hkv > 0 && D > 0 && D % 2 == 0 && D / 2 <= kRopeMaxHalf && block_size > 0, "N=", N,
           " Hq=", Hq, " Hkv=", Hkv, " D=", D);
  ZP_CHECK(theta > 0 && positions, "rope_kv_cache_write: theta ", theta, ", positions are required");
  ZP_CHECK(row_stride >= (Hq + 2 * Hkv) * D, "rope_kv_cache_write: row stride ", row_stride, " too small");
  const int64_t half = D / 2, total = N * (Hq + 2 * Hkv) * half;
  if (total == 0) return;
  ZP_CHECK(total < (int64_t(1) << 31) - int64_t(65535) * 8 * 256, "rope_kv_cache_write: ", N, " rows is too many");
  const InvFreq inv_freq = inv_freqs(theta, D);
  const unsigned grid = grid_for(total);
  ZP_CUDA_DISPATCH_FLOAT(dt, E, [&] {
    launch_dependent(rope_kv_cache_kernel<E, uint32_t>, dim3(grid), dim3(256), 0, s, static_cast<E*>(qkv), uint32_t(N),
                     uint32_t(Hq), uint32_t(Hkv), uint32_t(D), row_stride, positions, static_cast<E*>(k_cache),
                     static_cast<E*>(v_cache), slots, inv_freq);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

void rope_forward(StreamHandle s, DType dt, void* y, const void* x, int64_t B, int64_t T, int64_t H, int64_t D,
                  float theta, int64_t pos_offset, int64_t row_stride, const int32_t* positions) {
  rope_apply(s, dt, y, x, B, T, H, D, theta, pos_offset, row_stride ? row_stride : H * D, positions, +1.f);
}

void rope_backward(StreamHandle s, DType dt, void* dx, const void* dy, int64_t B, int64_t T, int64_t H, int64_t D,
                   float theta, int64_t pos_offset, int64_t row_stride, const int32_t* positions) {
  rope_apply(s, dt, dx, dy, B, T, H, D, theta, pos_offset, row_stride ? row_stride : H * D, positions, -1.f);
}

}  // namespace zp::kernels::cuda
