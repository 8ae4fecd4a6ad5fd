// One thread per element; the mask is recomputed from the counter hash (kernels/dropout.h).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/dropout.h"

namespace zp::kernels::cuda {
namespace {

template <class T>
__global__ void dropout_kernel(T* y, int64_t ldy, const T* x, int64_t ldx, int64_t rows, int64_t cols,
                               int64_t first_row, uint64_t key, float p, float keep_scale, bool accumulate) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    const uint64_t index = uint64_t(first_row + r) * uint64_t(cols) + uint64_t(c);
    const float v = dropout_keep_draw(key, index) >= p ? to_f(x[r * ldx + c]) * keep_scale : 0.f;
    T& out = y[r * ldy + c];
    out = from_f<T>(accumulate ? to_f(out) + v : v);
  }
}

}  // namespace

void dropout_apply(StreamHandle s, DType dt, void* y, int64_t ldy, const void* x, int64_t ldx, int64_t rows,
                   int64_t cols, int64_t first_row, uint64_t key, float p, bool accumulate) {
  ZP_CHECK(p >= 0.f && p < 1.f, "dropout probability ", p, " is not in [0, 1)");
  const int64_t n = rows * cols;
  if (n == 0) return;
  if (!ldx) ldx = cols;
  if (!ldy) ldy = cols;
  const long long blocks = (n + 255) / 256;
  const unsigned grid = unsigned(blocks < 65535 * 8 ? blocks : 65535 * 8);
  const float keep_scale = float(1.0 / (1.0 - double(p)));
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    dropout_kernel<<<grid, 256, 0, s>>>(static_cast<T*>(y), ldy, static_cast<const T*>(x), ldx, rows, cols, first_row,
                                        key, p, keep_scale, accumulate);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace zp::kernels::cuda
