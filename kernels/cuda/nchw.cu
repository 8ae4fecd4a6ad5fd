// NCHW layout ops. The transpose moves 32x32 tiles through shared memory so that both the read of x
// and the write of y are coalesced rows; the tile has a pitch of 33 so the column-wise reads of the
// second phase hit 32 different banks. The tile holds floats, which represent bf16/f16 exactly.
// channel_sum gives each (n, c) row to one warp (rows are HW long, usually >= 64).
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/nchw.h"

namespace zp::kernels::cuda {
namespace {

constexpr int kTile = 32, kRowsPerPass = 8;

// Block (32, 8) moves the tile x[b][p0 : p0+32, q0 : q0+32] to y[b][q0 : q0+32, p0 : p0+32].
template <class T>
__global__ void transpose_kernel(T* __restrict__ y, const T* __restrict__ x, int64_t P, int64_t Q) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t b = blockIdx.z, p0 = int64_t(blockIdx.y) * kTile, q0 = int64_t(blockIdx.x) * kTile;
  const T* xb = x + b * P * Q;
  T* yb = y + b * P * Q;
  for (int i = threadIdx.y; i < kTile; i += kRowsPerPass) {
    const int64_t p = p0 + i, q = q0 + threadIdx.x;
    if (p < P && q < Q) tile[i][threadIdx.x] = to_f(xb[p * Q + q]);
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += kRowsPerPass) {
    const int64_t q = q0 + i, p = p0 + threadIdx.x;
    if (p < P && q < Q) yb[q * P + p] = from_f<T>(tile[threadIdx.x][i]);
  }
}

template <class T>
__global__ void channel_add_kernel(T* y, const T* shift, int64_t total, int64_t HW) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = from_f<T>(to_f(y[i]) + to_f(shift[i / HW]));
}

template <class T>
__global__ void channel_sum_kernel(T* sum, const T* x, int64_t rows, int64_t HW) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t r = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5); r < rows; r += warps) {
    const T* row = x + r * HW;
    float acc = 0.f;
    for (int64_t i = lane; i < HW; i += 32) acc += to_f(row[i]);
    acc = warp_sum(acc);
    if (lane == 0) sum[r] = from_f<T>(acc);
  }
}

unsigned grid_for(int64_t work, int per_block) {
  int64_t blocks = (work + per_block - 1) / per_block;
  return unsigned(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

}  // namespace

void transpose_batched(StreamHandle s, DType dt, void* y, const void* x, int64_t B, int64_t P, int64_t Q) {
  ZP_CHECK(B >= 0 && P >= 0 && Q >= 0, "B=", B, " P=", P, " Q=", Q);
  if (B * P * Q == 0) return;
  ZP_CHECK(y != x, "transpose_batched is out of place");
  ZP_CHECK(B <= 65535 && (P + kTile - 1) / kTile <= 65535, "transpose_batched: B=", B, " P=", P, " too large");
  dim3 grid(ceil_div(Q, kTile), ceil_div(P, kTile), unsigned(B)), block(kTile, kRowsPerPass);
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    transpose_kernel<<<grid, block, 0, s>>>(static_cast<T*>(y), static_cast<const T*>(x), P, Q);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

void channel_add(StreamHandle s, DType dt, void* y, const void* shift, int64_t N, int64_t C, int64_t HW) {
  ZP_CHECK(N >= 0 && C >= 0 && HW >= 0, "N=", N, " C=", C, " HW=", HW);
  const int64_t total = N * C * HW;
  if (total == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    channel_add_kernel<<<grid_for(total, 256), 256, 0, s>>>(static_cast<T*>(y), static_cast<const T*>(shift), total,
                                                            HW);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

void channel_sum(StreamHandle s, DType dt, void* sum, const void* x, int64_t N, int64_t C, int64_t HW) {
  ZP_CHECK(N >= 0 && C >= 0 && HW >= 0, "N=", N, " C=", C, " HW=", HW);
  const int64_t rows = N * C;
  if (rows == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    channel_sum_kernel<<<grid_for(rows, 8), 256, 0, s>>>(static_cast<T*>(sum), static_cast<const T*>(x), rows, HW);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace zp::kernels::cuda
