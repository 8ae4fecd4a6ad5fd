#include "kernels/rope.h"

#include <cmath>
#include <vector>

#include "kernels/paged_attention.h"

namespace zp::kernels::cpu {
namespace {

// sign = +1 rotates by +a (forward), -1 by -a (backward: the transpose of the rotation).
void rope_apply(DType dt, void* y, const void* x, int64_t B, int64_t T, int64_t H, int64_t D, float theta,
                int64_t pos_offset, int64_t row_stride, const int32_t* positions, double sign) {
  ZP_CHECK(B >= 0 && T >= 0 && H >= 0 && D > 0 && D % 2 == 0 && D <= 1024, "B=", B, " T=", T, " H=", H, " D=", D);
  ZP_CHECK(theta > 0 && pos_offset >= 0, "theta=", theta, " pos_offset=", pos_offset);
  ZP_CHECK(!positions || pos_offset == 0, "rope: pos_offset ", pos_offset, " together with explicit positions");
  const int64_t half = D / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv_freq[size_t(i)] = 1.0f / std::pow(theta, float(2 * i) / float(D));
  std::vector<double> cos_a(static_cast<size_t>(half)), sin_a(static_cast<size_t>(half));
  ZP_DISPATCH_FLOAT(dt, E, [&] {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        const int64_t pos = positions ? int64_t(positions[b * T + t]) : pos_offset + t;
        for (int64_t i = 0; i < half; ++i) {
          const float a = float(pos) * inv_freq[size_t(i)];
          cos_a[size_t(i)] = double(float(std::cos(double(a))));
          sin_a[size_t(i)] = sign * double(float(std::sin(double(a))));
        }
        for (int64_t h = 0; h < H; ++h) {
          const int64_t off = (b * T + t) * row_stride + h * D;
          const E* in = static_cast<const E*>(x) + off;
          E* out = static_cast<E*>(y) + off;
          for (int64_t i = 0; i < half; ++i) {
            const double x1 = double(in[i]), x2 = double(in[i + half]);
            const double c = cos_a[size_t(i)], sn = sin_a[size_t(i)];
            out[i] = E(x1 * c - x2 * sn);
            out[i + half] = E(x2 * c + x1 * sn);
          }
        }
      }
    }
  });
}

}  // namespace

void rope_forward(StreamHandle, DType dt, void* y, const void* x, int64_t B, int64_t T, int64_t H, int64_t D,
                  float theta, int64_t pos_offset, int64_t row_stride, const int32_t* positions) {
  rope_apply(dt, y, x, B, T, H, D, theta, pos_offset, row_stride ? row_stride : H * D, positions, +1.0);
}

void rope_backward(StreamHandle, DType dt, void* dx, const void* dy, int64_t B, int64_t T, int64_t H, int64_t D,
                   float theta, int64_t pos_offset, int64_t row_stride, const int32_t* positions) {
  rope_apply(dt, dx, dy, B, T, H, D, theta, pos_offset, row_stride ? row_stride : H * D, positions, -1.0);
}

void rope_kv_cache_write(StreamHandle s, DType dt, void* qkv, int64_t N, int64_t Hq, int64_t Hkv, int64_t D,
                         int64_t row_stride, float theta, const int32_t* positions, void* k_cache, void* v_cache,
                         const int32_t* slots, int64_t block_size) {
  ZP_CHECK(positions, "rope_kv_cache_write: positions are required");
  ZP_CHECK(row_stride >= (Hq + 2 * Hkv) * D, "rope_kv_cache_write: row stride ", row_stride, " too small");
  rope_forward(s, dt, qkv, qkv, 1, N, Hq + Hkv, D, theta, 0, row_stride, positions);
  const size_t esz = dtype_size(dt);
  const char* base = static_cast<const char*>(qkv);
  kv_cache_write(s, dt, k_cache, v_cache, base + size_t(Hq * D) * esz, base + size_t((Hq + Hkv) * D) * esz, N, Hkv, D,
                 row_stride, row_stride, slots, block_size);
}

}  // namespace zp::kernels::cpu
