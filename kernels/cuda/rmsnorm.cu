// RMSNorm over rows, fp32 statistics whatever the storage type; rows are loaded as 16-byte packs
// when C and the pointers allow it (scalar otherwise, so odd C works).
// Forward: a warp per row when the row is short and the rows fill the GPU, a block per row otherwise.
// Backward, the trick (after llm.c): one block walks a strided set of rows, and every thread owns the
// same columns in every row, so the block keeps its dweight partial sums in shared memory without
// shared atomics and adds them to the fp32 gradient once at the end: one global atomicAdd per column
// per block instead of one per column per row.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/rmsnorm.h"

namespace zp::kernels::cuda {
namespace {


template <class T, int VEC, bool kBlockPerRow>
__global__ void rmsnorm_forward_kernel(T* y, float* rstd, const T* x, const T* __restrict__ weight, int64_t N, int C,
                                       float eps) {
  pdl_launch_dependents();  // the next kernel of a decode step may start (cuda_common.cuh)
  pdl_wait();               // launched as a dependent of the kernel ahead (launch_dependent)
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

  float sq = 0.f;
  for (int p = tid; p < packs; p += nthreads) {
    const P xv = xr[p];
#pragma unroll
    for (int j = 0; j < VEC; ++j) sq += to_f(xv.v[j]) * to_f(xv.v[j]);
  }
  const float r = rsqrtf(row_sum<kBlockPerRow>(sq) / float(C) + eps);

  const P* wp = reinterpret_cast<const P*>(weight);
  P* yr = reinterpret_cast<P*>(y + row * C);
  for (int p = tid; p < packs; p += nthreads) {
    const P xv = xr[p], wv = wp[p];
    P out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) out.v[j] = from_f<T>(to_f(xv.v[j]) * r * to_f(wv.v[j]));
    yr[p] = out;
  }
  if (tid == 0) rstd[row] = r;
}

// Shared memory holds the block's dweight partial sums, pack-major per element slot (index
// j * packs + p) so that neighbouring threads touch neighbouring banks.
template <class T, int VEC>
__global__ void rmsnorm_backward_kernel(T* __restrict__ dx, float* __restrict__ dweight, const T* __restrict__ dy,
                                        const T* __restrict__ x, const T* __restrict__ weight,
                                        const float* __restrict__ rstd, int64_t N, int C, bool accumulate_dx) {
  using P = Pack<T, VEC>;
  extern __shared__ float dw_part[];
  const int packs = C / VEC;
  for (int p = threadIdx.x; p < packs; p += blockDim.x) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) dw_part[j * packs + p] = 0.f;
  }
  const P* wp = reinterpret_cast<const P*>(weight);

  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {  // uniform over the block: block_sum is safe
    const float r = rstd[row];
    const P* xr = reinterpret_cast<const P*>(x + row * C);
    const P* dyr = reinterpret_cast<const P*>(dy + row * C);
    float gx_sum = 0.f;
    for (int p = threadIdx.x; p < packs; p += blockDim.x) {
      const P xv = xr[p], dv = dyr[p], wv = wp[p];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xhat = to_f(xv.v[j]) * r, d = to_f(dv.v[j]);
        gx_sum += d * to_f(wv.v[j]) * xhat;
        dw_part[j * packs + p] += d * xhat;
      }
    }
    const float gx_mean = block_sum(gx_sum) / float(C);
    P* dxr = reinterpret_cast<P*>(dx + row * C);
    for (int p = threadIdx.x; p < packs; p += blockDim.x) {
      const P xv = xr[p], dv = dyr[p], wv = wp[p];
      P out = accumulate_dx ? dxr[p] : P{};
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xhat = to_f(xv.v[j]) * r;
        const float v = r * (to_f(dv.v[j]) * to_f(wv.v[j]) - xhat * gx_mean);
        out.v[j] = from_f<T>(accumulate_dx ? to_f(out.v[j]) + v : v);
      }
      dxr[p] = out;
    }
  }

  for (int p = threadIdx.x; p < packs; p += blockDim.x) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) atomicAdd(dweight + p * VEC + j, dw_part[j * packs + p]);
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
void launch_forward(StreamHandle s, T* y, float* rstd, const T* x, const T* w, int64_t N, int C, float eps) {
  // Fewer rows than SMs (a decode step's few tokens): a block per row, so a row's loads go out at
  // once instead of one warp walking them in turn (4.8 us for one 2048-wide row on an H200).
  if (C / VEC <= kWarpRowMaxPacks && N >= sm_count()) {
    launch_dependent(rmsnorm_forward_kernel<T, VEC, false>, dim3(ceil_div(N, kForwardWarpsPerBlock)),
                     dim3(kForwardWarpsPerBlock * 32), 0, s, y, rstd, x, w, N, C, eps);
  } else {
    launch_dependent(rmsnorm_forward_kernel<T, VEC, true>, dim3(unsigned(N)), dim3(kForwardBlockThreads), 0, s, y, rstd,
                     x, w, N, C, eps);
  }
}

template <class T, int VEC>
void launch_backward(StreamHandle s, T* dx, float* dw, const T* dy, const T* x, const T* w, const float* rstd,
                     int64_t N, int C, bool accumulate_dx) {
  auto kernel = rmsnorm_backward_kernel<T, VEC>;
  const int packs = C / VEC;
  const int threads = std::clamp((packs + 31) / 32 * 32, 32, 512);
  const size_t smem = size_t(C) * sizeof(float);
  allow_dynamic_smem(kernel, smem, "rmsnorm_backward");
  int per_sm = 0;
  ZP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  const int64_t grid = std::max<int64_t>(
      1, std::min<int64_t>(int64_t(sm_count()) * std::max(per_sm, 1),
                           (N + kBackwardMinRowsPerBlock - 1) / kBackwardMinRowsPerBlock));
  kernel<<<unsigned(grid), threads, smem, s>>>(dx, dw, dy, x, w, rstd, N, C, accumulate_dx);
}

void check_sizes(int64_t N, int64_t C) {
  ZP_CHECK(N >= 0 && N <= std::numeric_limits<int32_t>::max() && C > 0 && C <= std::numeric_limits<int32_t>::max(),
           "N=", N, " C=", C);
}

}  // namespace

void rmsnorm_forward(StreamHandle s, DType dt, void* y, float* rstd, const void* x, const void* weight, int64_t N,
                     int64_t C, float eps) {
  check_sizes(N, C);
  ZP_CHECK(rstd && weight);
  if (N == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    auto* py = static_cast<T*>(y);
    auto* px = static_cast<const T*>(x);
    auto* w = static_cast<const T*>(weight);
    if (can_vectorise<T>(C, {y, x, weight}))
      launch_forward<T, 16 / sizeof(T)>(s, py, rstd, px, w, N, int(C), eps);
    else
      launch_forward<T, 1>(s, py, rstd, px, w, N, int(C), eps);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

void rmsnorm_backward(StreamHandle s, DType dt, void* dx, float* dweight, const void* dy, const void* x,
                      const void* weight, const float* rstd, int64_t N, int64_t C, bool accumulate_dx) {
  check_sizes(N, C);
  ZP_CHECK(dweight && weight && rstd);
  if (N == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    auto* pdx = static_cast<T*>(dx);
    auto* pdy = static_cast<const T*>(dy);
    auto* px = static_cast<const T*>(x);
    auto* w = static_cast<const T*>(weight);
    if (can_vectorise<T>(C, {dx, dy, x, weight}))
      launch_backward<T, 16 / sizeof(T)>(s, pdx, dweight, pdy, px, w, rstd, N, int(C), accumulate_dx);
    else
      launch_backward<T, 1>(s, pdx, dweight, pdy, px, w, rstd, N, int(C), accumulate_dx);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace zp::kernels::cuda
