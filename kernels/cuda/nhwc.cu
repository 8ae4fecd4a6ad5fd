// Channels-last layout ops. The transpose moves 32x32 tiles through shared memory so that both the
// read of x and the write of y are coalesced rows; the tile has a pitch of 33 so the column-wise reads
// of the second phase hit 32 different banks. The tile holds floats, which represent bf16/f16 exactly.
// channel_sum is a column sum per sample (column_sums.cuh), its splits' fp32 partial sums added in a
// fixed order and rounded to dt by a second kernel.
#include <cstdint>

#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/scratch.cuh"
#include "kernels/nhwc.h"

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

// Element (or pack of VEC channels) i of y[N, HW, C] gets shift[n, c].
template <class T, int VEC>
__global__ void channel_add_kernel(T* y, const T* shift, int64_t packs, int64_t HW, int64_t C) {
  using P = Pack<T, VEC>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < packs; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = i * VEC, c = e % C, n = e / (HW * C);
    P v = reinterpret_cast<P*>(y)[i];
    const P sh = *reinterpret_cast<const P*>(shift + n * C + c);
#pragma unroll
    for (int j = 0; j < VEC; ++j) v.v[j] = from_f<T>(to_f(v.v[j]) + to_f(sh.v[j]));
    reinterpret_cast<P*>(y)[i] = v;
  }
}

// sum[n, c] = the partial sums of column c of sample n over its row splits, in dt.
template <class T>
__global__ void channel_sum_finish_kernel(T* sum, const float* partial, int64_t N, int64_t C, int64_t splits) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * C; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / C, c = i % C;
    float total = 0.f;
    for (int64_t k = 0; k < splits; ++k) total += partial[(n * splits + k) * C + c];
    sum[i] = from_f<T>(total);
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
    T* py = static_cast<T*>(y);
    const T* ps = static_cast<const T*>(shift);
    with_pack_width<T>(C, {py, ps}, [&](auto vec) {
      constexpr int VEC = decltype(vec)::value;
      channel_add_kernel<T, VEC><<<grid_for(total / VEC, 256), 256, 0, s>>>(py, ps, total / VEC, HW, C);
    });
  });
  ZP_CUDA_LAUNCH_CHECK();
}

void channel_sum(StreamHandle s, DType dt, void* sum, const void* x, int64_t N, int64_t C, int64_t HW) {
  ZP_CHECK(N >= 0 && C >= 0 && HW >= 0, "N=", N, " C=", C, " HW=", HW);
  if (N * C == 0) return;
  ZP_CHECK(N <= 65535, "channel_sum: N=", N, " too large");
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    with_pack_width<T>(C, {x}, [&](auto vec) {
      constexpr int VEC = decltype(vec)::value;
      const int64_t col_blocks = ceil_div(C, int64_t(kColumnSumCols) * VEC);
      const ColumnSumSplits sp(HW, col_blocks * N, int64_t(65535));
      KernelScratch partial(s, size_t(N * sp.splits * C) * sizeof(float), "channel_sum");
      const dim3 grid{unsigned(col_blocks), unsigned(sp.splits), unsigned(N)}, block{kColumnSumCols, kColumnSumRows};
      column_sums_kernel<T, VEC><<<grid, block, 0, s>>>(nullptr, partial.as<float>(), static_cast<const T*>(x), HW, C,
                                                        sp.rows_per_split);
      channel_sum_finish_kernel<T><<<grid_for(N * C, 256), 256, 0, s>>>(static_cast<T*>(sum), partial.as<float>(), N,
                                                                       C, sp.splits);
    });
  });
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace zp::kernels::cuda
