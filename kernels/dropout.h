// Inverted dropout whose mask is a counter hash, not a stored tensor: element (row, col) of a
// [rows, cols] matrix is kept iff dropout_keep_draw(key, (first_row + row) * cols + col) >= p, and kept
// values are scaled by 1 / (1 - p). So a forward, its backward (the gradient goes through the same
// mask) and an activation-checkpointed re-forward all draw the same mask from (key, index) alone,
// nothing [rows, cols] is saved, and a row's mask depends on its global position (first_row), not
// on which rank or micro-batch runs it.
#pragma once
#include "kernels/kernel.h"

#ifdef __CUDACC__
#define ZP_DROPOUT_HD __host__ __device__
#else
#define ZP_DROPOUT_HD
#endif

namespace zp::kernels {

// A uniform draw in [0, 1) with 24 bits (SplitMix64's finaliser over key and index), the same on the
// CPU and the GPU.
ZP_DROPOUT_HD inline float dropout_keep_draw(uint64_t key, uint64_t index) {
  uint64_t x = key ^ (index * 0x9E3779B97F4A7C15ull);
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return float(x >> 40) * (1.0f / 16777216.0f);
}

// y = mask(x) (or y += mask(x) with accumulate); x and y are [rows, cols] with row strides ldx and ldy
// (0: cols). y may alias x (not with accumulate). 0 <= p < 1.
ZP_KERNEL(void dropout_apply(StreamHandle s, DType dt, void* y, int64_t ldy, const void* x, int64_t ldx,
                             int64_t rows, int64_t cols, int64_t first_row, uint64_t key, float p,
                             bool accumulate))

}  // namespace zp::kernels
