// RoPE. The inverse frequencies are computed on the host, exactly as the CPU reference and HF do
// (float32 pow), and passed by value as a __grid_constant__ kernel parameter, so the device never
// re-derives them with its own, differently rounded powf. Each thread owns one (token, pair i),
// computes sincosf of its angle once and rotates that pair in all H heads; consecutive threads take
// consecutive i, so both halves of each head are read and written coalesced. With explicit positions
// (packed sequences) the thread reads its token's position instead of deriving it from t.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/rope.h"

namespace zp::kernels::cuda {
namespace {

constexpr int kMaxHalf = 512;  // D <= 1024
struct InvFreq {
  float v[kMaxHalf];
};

template <class T>
__global__ void rope_kernel(T* y, const T* x, int64_t BT, int64_t T_, int64_t H, int64_t D, int64_t pos_offset,
                            int64_t row_stride, const int32_t* __restrict__ positions, float sign,
                            const __grid_constant__ InvFreq inv_freq) {
  const int64_t half = D / 2, total = BT * half;
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < total; p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t bt = p / half, i = p - bt * half, t = bt % T_;
    const int64_t pos = positions ? int64_t(positions[bt]) : pos_offset + t;
    const float a = float(pos) * inv_freq.v[i];
    float sn, c;
    sincosf(a, &sn, &c);
    sn *= sign;
    const int64_t base = bt * row_stride + i;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t off = base + h * D;
      const float x1 = to_f(x[off]), x2 = to_f(x[off + half]);
      y[off] = from_f<T>(x1 * c - x2 * sn);
      y[off + half] = from_f<T>(x2 * c + x1 * sn);
    }
  }
}

void rope_apply(StreamHandle s, DType dt, void* y, const void* x, int64_t B, int64_t T, int64_t H, int64_t D,
                float theta, int64_t pos_offset, int64_t row_stride, const int32_t* positions, float sign) {
  ZP_CHECK(B >= 0 && T >= 0 && H >= 0 && D > 0 && D % 2 == 0 && D / 2 <= kMaxHalf, "B=", B, " T=", T, " H=", H,
           " D=", D);
  ZP_CHECK(theta > 0 && pos_offset >= 0, "theta=", theta, " pos_offset=", pos_offset);
  ZP_CHECK(!positions || pos_offset == 0, "rope: pos_offset ", pos_offset, " together with explicit positions");
  const int64_t half = D / 2, total = B * T * half;
  if (total == 0 || H == 0) return;
  InvFreq inv_freq{};
  for (int64_t i = 0; i < half; ++i) inv_freq.v[i] = 1.0f / std::pow(theta, float(2 * i) / float(D));
  int64_t blocks = (total + 255) / 256;
  const unsigned grid = unsigned(blocks < 65535 * 8 ? blocks : 65535 * 8);
  ZP_CUDA_DISPATCH_FLOAT(dt, E, [&] {
    rope_kernel<<<grid, 256, 0, s>>>(static_cast<E*>(y), static_cast<const E*>(x), B * T, T, H, D, pos_offset,
                                     row_stride, positions, sign, inv_freq);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace

void rope_forward(StreamHandle s, DType dt, void* y, const void* x, int64_t B, int64_t T, int64_t H, int64_t D,
                  float theta, int64_t pos_offset, int64_t row_stride, const int32_t* positions) {
  rope_apply(s, dt, y, x, B, T, H, D, theta, pos_offset, row_stride ? row_stride : H * D, positions, +1.f);
}

void rope_backward(StreamHandle s, DType dt, void* dx, const void* dy, int64_t B, int64_t T, int64_t H, int64_t D,
                   float theta, int64_t pos_offset, int64_t row_stride, const int32_t* positions) {
  rope_apply(s, dt, dx, dy, B, T, H, D, theta, pos_offset, row_stride ? row_stride : H * D, positions, -1.f);
}

}  // namespace zp::kernels::cuda
