// LayerNorm over rows, fp32 statistics whatever the storage type; rows are loaded as 16-byte packs
// when C and the pointers allow it (scalar otherwise, so odd C works).
// Forward: a warp per row when the row is short, a block per row when it is long; two passes over x
// (mean, then centred variance) since the row is still in L1/L2 for the second one.
// Backward, the trick (after llm.c): one block walks a strided set of rows, and every thread owns the
// same columns in every row, so the block keeps its dweight/dbias partial sums in shared memory
// without shared atomics and adds them to the fp32 gradients once at the end: one global atomicAdd
// per column per block instead of one per column per row.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/layernorm.h"

namespace zp::kernels::cuda {
namespace {


template <class T, int VEC, bool kBlockPerRow>
__global__ void layernorm_forward_kernel(T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd,
                                         const T* __restrict__ x, const T* __restrict__ weight,
                                         const T* __restrict__ bias, int64_t N, int C, float eps) {
  using P = Pack<T, VEC>;
  int64_t row;
  int tid, nthreads;
  if constexpr (kBlockPerRow) {
    row = blockIdx.x, tid = threadIdx.x, nthreads = blockDim.x;
  } else {
    row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32, tid = threadIdx.x % 32, nthreads = 32;
    if (row >= N) return;  // the whole warp leaves together
  }
  const int packs = C / VEC;
  const P* xr = reinterpret_cast<const P*>(x + row * C);

  float sum = 0.f;
  for (int p = tid; p < packs; p += nthreads) {
    const P xv = xr[p];
#pragma unroll
    for (int j = 0; j < VEC; ++j) sum += to_f(xv.v[j]);
  }
  const float m = row_sum<kBlockPerRow>(sum) / float(C);
  float sq = 0.f;
  for (int p = tid; p < packs; p += nthreads) {
    const P xv = xr[p];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float d = to_f(xv.v[j]) - m;
      sq += d * d;
    }
  }
  const float r = rsqrtf(row_sum<kBlockPerRow>(sq) / float(C) + eps);

  const P* wp = reinterpret_cast<const P*>(weight);
  const P* bp = reinterpret_cast<const P*>(bias);
  P* yr = reinterpret_cast<P*>(y + row * C);
  for (int p = tid; p < packs; p += nthreads) {
    const P xv = xr[p], wv = wp[p];
    const P bv = bias ? bp[p] : P{};
    P out;
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      out.v[j] = from_f<T>((to_f(xv.v[j]) - m) * r * to_f(wv.v[j]) + (bias ? to_f(bv.v[j]) : 0.f));
    yr[p] = out;
  }
  if (tid == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// Shared memory holds the block's partial sums, pack-major per element slot (index j * packs + p) so
// that neighbouring threads touch neighbouring banks: dweight first, then dbias when there is one.
template <class T, int VEC>
__global__ void layernorm_backward_kernel(T* __restrict__ dx, float* __restrict__ dweight, float* __restrict__ dbias,
                                          const T* __restrict__ dy, const T* __restrict__ x,
                                          const T* __restrict__ weight, const float* __restrict__ mean,
                                          const float* __restrict__ rstd, int64_t N, int C, bool accumulate_dx) {
  using P = Pack<T, VEC>;
  extern __shared__ float partial[];
  const int packs = C / VEC;
  float* dw_part = partial;
  float* db_part = partial + C;
  for (int p = threadIdx.x; p < packs; p += blockDim.x) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      dw_part[j * packs + p] = 0.f;
      if (dbias) db_part[j * packs + p] = 0.f;
    }
  }
  const P* wp = reinterpret_cast<const P*>(weight);

  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {  // uniform over the block: block_sum is safe
    const float m = mean[row], r = rstd[row];
    const P* xr = reinterpret_cast<const P*>(x + row * C);
    const P* dyr = reinterpret_cast<const P*>(dy + row * C);
    float g_sum = 0.f, gx_sum = 0.f;
    for (int p = threadIdx.x; p < packs; p += blockDim.x) {
      const P xv = xr[p], dv = dyr[p], wv = wp[p];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xhat = (to_f(xv.v[j]) - m) * r, d = to_f(dv.v[j]), g = d * to_f(wv.v[j]);
        g_sum += g;
        gx_sum += g * xhat;
        dw_part[j * packs + p] += d * xhat;
        if (dbias) db_part[j * packs + p] += d;
      }
    }
    const float g_mean = block_sum(g_sum) / float(C);
    const float gx_mean = block_sum(gx_sum) / float(C);
    P* dxr = reinterpret_cast<P*>(dx + row * C);
    for (int p = threadIdx.x; p < packs; p += blockDim.x) {
      const P xv = xr[p], dv = dyr[p], wv = wp[p];
      P out = accumulate_dx ? dxr[p] : P{};
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xhat = (to_f(xv.v[j]) - m) * r;
        const float v = r * (to_f(dv.v[j]) * to_f(wv.v[j]) - g_mean - xhat * gx_mean);
        out.v[j] = from_f<T>(accumulate_dx ? to_f(out.v[j]) + v : v);
      }
      dxr[p] = out;
    }
  }

  for (int p = threadIdx.x; p < packs; p += blockDim.x) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      atomicAdd(dweight + p * VEC + j, dw_part[j * packs + p]);
      if (dbias) atomicAdd(dbias + p * VEC + j, db_part[j * packs + p]);
    }
  }
}

// Backward for short rows (at most 4 packs per lane): a warp per row, so the row reductions are
// shuffles with no block barriers. Each warp keeps the dweight/dbias partial sums of the rows it visits
// in its own slice of shared memory, laid out [VEC][packs] so that the lanes' adds for one element of
// their packs hit consecutive words. In registers they made a lane 167 registers at C = 768 bf16 (113
// now), which left one block of 8 warps an SM, too few loads in flight (34% of an H200's bandwidth).
// At the end the block sums its warps' slices and adds them to the fp32 gradients once.
template <class T, int VEC, int PPL>
__global__ void layernorm_backward_warp_kernel(T* __restrict__ dx, float* __restrict__ dweight,
                                               float* __restrict__ dbias, const T* __restrict__ dy,
                                               const T* __restrict__ x, const T* __restrict__ weight,
                                               const float* __restrict__ mean, const float* __restrict__ rstd,
                                               int64_t N, int C, bool accumulate_dx) {
  using P = Pack<T, VEC>;
  extern __shared__ float partial[];  // per warp: [VEC][packs] dweight, then (with dbias) the same for dbias
  const int packs = C / VEC, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int slice = (dbias ? 2 : 1) * C;
  for (int i = threadIdx.x; i < warps * slice; i += blockDim.x) partial[i] = 0.f;
  __syncthreads();
  float* dw_acc = partial + warp * slice;
  float* db_acc = dw_acc + C;
  P wv[PPL];
#pragma unroll
  for (int k = 0; k < PPL; ++k) {
    const int p = lane + 32 * k;
    if (p < packs) wv[k] = reinterpret_cast<const P*>(weight)[p];
  }
  for (int64_t row = int64_t(blockIdx.x) * warps + warp; row < N; row += int64_t(gridDim.x) * warps) {
    const float m = mean[row], r = rstd[row];
    const P* xr = reinterpret_cast<const P*>(x + row * C);
    const P* dyr = reinterpret_cast<const P*>(dy + row * C);
    P xv[PPL], dv[PPL];
    float g_sum = 0.f, gx_sum = 0.f;
#pragma unroll
    for (int k = 0; k < PPL; ++k) {
      const int p = lane + 32 * k;
      if (p >= packs) continue;
      xv[k] = xr[p];
      dv[k] = dyr[p];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xhat = (to_f(xv[k].v[j]) - m) * r, d = to_f(dv[k].v[j]), g = d * to_f(wv[k].v[j]);
        g_sum += g;
        gx_sum += g * xhat;
        dw_acc[j * packs + p] += d * xhat;
        if (dbias) db_acc[j * packs + p] += d;
      }
    }
    const float g_mean = warp_sum(g_sum) / float(C), gx_mean = warp_sum(gx_sum) / float(C);
    P* dxr = reinterpret_cast<P*>(dx + row * C);
#pragma unroll
    for (int k = 0; k < PPL; ++k) {
      const int p = lane + 32 * k;
      if (p >= packs) continue;
      P out = accumulate_dx ? dxr[p] : P{};
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xhat = (to_f(xv[k].v[j]) - m) * r;
        const float v = r * (to_f(dv[k].v[j]) * to_f(wv[k].v[j]) - g_mean - xhat * gx_mean);
        out.v[j] = from_f<T>(accumulate_dx ? to_f(out.v[j]) + v : v);
      }
      dxr[p] = out;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < C; i += blockDim.x) {
    const int at = (i % VEC) * packs + i / VEC;  // column i = pack i / VEC, element i % VEC
    float w_sum = 0.f, b_sum = 0.f;
    for (int w = 0; w < warps; ++w) {
      w_sum += partial[w * slice + at];
      if (dbias) b_sum += partial[w * slice + C + at];
    }
    atomicAdd(dweight + i, w_sum);
    if (dbias) atomicAdd(dbias + i, b_sum);
  }
}

// Rows of at most this many packs get a warp each; longer rows get a block.
constexpr int kWarpRowMaxPacks = 256;
constexpr int kForwardWarpsPerBlock = 8;
constexpr int kForwardBlockThreads = 256;
// A backward block handles at least this many rows (when there are enough), so that its one flush of
// C atomics is spread over several rows of work.
constexpr int64_t kBackwardMinRowsPerBlock = 8;



template <class T, int VEC>
void launch_forward(StreamHandle s, T* y, float* mean, float* rstd, const T* x, const T* w, const T* b, int64_t N,
                    int C, float eps) {
  if (C / VEC <= kWarpRowMaxPacks) {
    layernorm_forward_kernel<T, VEC, false><<<ceil_div(N, kForwardWarpsPerBlock), kForwardWarpsPerBlock * 32, 0, s>>>(
        y, mean, rstd, x, w, b, N, C, eps);
  } else {
    layernorm_forward_kernel<T, VEC, true><<<unsigned(N), kForwardBlockThreads, 0, s>>>(y, mean, rstd, x, w, b, N, C,
                                                                                        eps);
  }
}

template <class T, int VEC>
void launch_backward(StreamHandle s, T* dx, float* dw, float* db, const T* dy, const T* x, const T* w,
                     const float* mean, const float* rstd, int64_t N, int C, bool accumulate_dx) {
  const int packs = C / VEC;
  if (packs <= 4 * 32) {
    // 4 warps a block: with 95-113 registers a lane, blocks of 8 warps fitted only 1-2 an SM.
    constexpr int kThreads = 128, kWarps = kThreads / 32;
    const size_t smem = size_t(kWarps) * size_t(db ? 2 : 1) * size_t(C) * sizeof(float);
    auto launch = [&](auto kernel) {
      allow_dynamic_smem(kernel, smem, "layernorm_backward");
      int per_sm = 0;
      ZP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
      const int64_t grid = std::max<int64_t>(
          1, std::min<int64_t>(int64_t(sm_count()) * std::max(per_sm, 1),
                               (N + kWarps * kBackwardMinRowsPerBlock - 1) / (kWarps * kBackwardMinRowsPerBlock)));
      kernel<<<unsigned(grid), kThreads, smem, s>>>(dx, dw, db, dy, x, w, mean, rstd, N, C, accumulate_dx);
    };
    if (packs <= 32) launch(layernorm_backward_warp_kernel<T, VEC, 1>);
    else if (packs <= 64) launch(layernorm_backward_warp_kernel<T, VEC, 2>);
    else if (packs <= 96) launch(layernorm_backward_warp_kernel<T, VEC, 3>);
    else launch(layernorm_backward_warp_kernel<T, VEC, 4>);
    return;
  }
  auto kernel = layernorm_backward_kernel<T, VEC>;
  const int threads = std::clamp((packs + 31) / 32 * 32, 32, 512);
  const size_t smem = size_t(db ? 2 : 1) * size_t(C) * sizeof(float);
  allow_dynamic_smem(kernel, smem, "layernorm_backward");
  int per_sm = 0;
  ZP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  const int64_t grid = std::max<int64_t>(
      1, std::min<int64_t>(int64_t(sm_count()) * std::max(per_sm, 1),
                           (N + kBackwardMinRowsPerBlock - 1) / kBackwardMinRowsPerBlock));
  kernel<<<unsigned(grid), threads, smem, s>>>(dx, dw, db, dy, x, w, mean, rstd, N, C, accumulate_dx);
}

void check_sizes(int64_t N, int64_t C) {
  ZP_CHECK(N >= 0 && N <= std::numeric_limits<int32_t>::max() && C > 0 && C <= std::numeric_limits<int32_t>::max(),
           "N=", N, " C=", C);
}

}  // namespace

void layernorm_forward(StreamHandle s, DType dt, void* y, float* mean, float* rstd, const void* x, const void* weight,
                       const void* bias, int64_t N, int64_t C, float eps) {
  check_sizes(N, C);
  ZP_CHECK(mean && rstd && weight);
  if (N == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    auto* py = static_cast<T*>(y);
    auto* px = static_cast<const T*>(x);
    auto* w = static_cast<const T*>(weight);
    auto* b = static_cast<const T*>(bias);
    if (can_vectorise<T>(C, {y, x, weight, bias}))
      launch_forward<T, 16 / sizeof(T)>(s, py, mean, rstd, px, w, b, N, int(C), eps);
    else
      launch_forward<T, 1>(s, py, mean, rstd, px, w, b, N, int(C), eps);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

void layernorm_backward(StreamHandle s, DType dt, void* dx, float* dweight, float* dbias, const void* dy, const void* x,
                        const void* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                        bool accumulate_dx) {
  check_sizes(N, C);
  ZP_CHECK(dweight && weight && mean && rstd);
  if (N == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    auto* pdx = static_cast<T*>(dx);
    auto* pdy = static_cast<const T*>(dy);
    auto* px = static_cast<const T*>(x);
    auto* w = static_cast<const T*>(weight);
    if (can_vectorise<T>(C, {dx, dy, x, weight}))
      launch_backward<T, 16 / sizeof(T)>(s, pdx, dweight, dbias, pdy, px, w, mean, rstd, N, int(C), accumulate_dx);
    else
      launch_backward<T, 1>(s, pdx, dweight, dbias, pdy, px, w, mean, rstd, N, int(C), accumulate_dx);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace zp::kernels::cuda
