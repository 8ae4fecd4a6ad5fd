// Column sums in fp32 of row-major matrices x[b][rows, cols] (a batch of them, blockIdx.z picking b),
// in a fixed order so that the result never depends on timing: blocks of (32 packs of VEC columns,
// 16-byte loads where cols and x allow) x (8 row lanes) over one split of the rows, the lanes combined
// in shared memory, the splits' partial sums added by a second pass. Serves a linear's or a
// convolution's bias gradient (gemm.cu) and the per-sample channel sums of an NHWC image (nhwc.cu).
#pragma once
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace zp::kernels::cuda {

constexpr int kColumnSumCols = 32, kColumnSumRows = 8;

// add_to[b * cols + c] += the sum of column c over the rows of x[b] when the grid has one split
// (gridDim.y == 1) and add_to is given; otherwise partial[(b * splits + split) * cols + c] = the sum
// over this split's rows.
template <class T, int VEC>
__global__ void column_sums_kernel(float* add_to, float* partial, const T* x, int64_t rows, int64_t cols,
                                   int64_t rows_per_split) {
  __shared__ float sums[kColumnSumRows][kColumnSumCols * VEC + 1];
  const int64_t b = blockIdx.z, split = blockIdx.y, splits = gridDim.y;
  const int64_t c0 = (int64_t(blockIdx.x) * kColumnSumCols + threadIdx.x) * VEC;
  const int64_t r0 = split * rows_per_split, r1 = min(rows, r0 + rows_per_split);
  const T* xb = x + b * rows * cols;
  float acc[VEC] = {};
  if (c0 < cols)
#pragma unroll 4
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColumnSumRows) {
      const Pack<T, VEC> v = *reinterpret_cast<const Pack<T, VEC>*>(xb + r * cols + c0);
#pragma unroll
      for (int j = 0; j < VEC; ++j) acc[j] += to_f(v.v[j]);
    }
#pragma unroll
  for (int j = 0; j < VEC; ++j) sums[threadIdx.y][threadIdx.x * VEC + j] = acc[j];
  __syncthreads();
  for (int k = threadIdx.y * kColumnSumCols + threadIdx.x; k < kColumnSumCols * VEC;
       k += kColumnSumCols * kColumnSumRows) {
    const int64_t col = int64_t(blockIdx.x) * kColumnSumCols * VEC + k;
    if (col >= cols) continue;
    float total = 0.f;
    for (int y = 0; y < kColumnSumRows; ++y) total += sums[y][k];
    if (add_to && splits == 1) add_to[b * cols + col] += total;
    else partial[(b * splits + split) * cols + col] = total;
  }
}

// How column_sums_kernel splits `rows`: enough splits for about two blocks an SM over `blocks` blocks
// a split (column blocks times matrices), each split at least 64 rows, at most max_splits.
struct ColumnSumSplits {
  int64_t splits, rows_per_split;
  ColumnSumSplits(int64_t rows, int64_t blocks, int64_t max_splits) {
    splits = std::max<int64_t>(1, int64_t(ceil_div(int64_t(2) * sm_count(), blocks)));
    splits = std::max<int64_t>(1, std::min({splits, int64_t(ceil_div(rows, 64)), max_splits, int64_t(65535)}));
    rows_per_split = (rows + splits - 1) / splits;
    splits = (rows + rows_per_split - 1) / rows_per_split;
  }
};

}  // namespace zp::kernels::cuda
