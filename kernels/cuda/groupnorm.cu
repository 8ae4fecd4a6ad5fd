// GroupNorm (+ optional SiLU) for NCHW, fp32 statistics whatever the storage type.
// The trick: in NCHW a group (n, g) is one contiguous span of C/G * HW elements, so the statistics
// are a plain block reduction over a span, one block per (n, g) (two passes: mean, then centred
// variance, the second served mostly from L2). The affine + SiLU is then a flat elementwise kernel
// over all elements, which keeps the whole GPU busy even when N * G is small.
// Backward: one block per (n, g) walks the group channel by channel; each channel's sums of dz and
// dz * xhat over HW are block-reduced once and give both that channel's dweight/dbias contribution
// (one atomicAdd per channel per block) and, weighted by weight[c], the group sums that dx needs.
// Loads are 16-byte packs when HW and the pointers allow it (a pack never straddles two channels).
#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/groupnorm.h"

namespace zp::kernels::cuda {
namespace {

__device__ __forceinline__ float sigmoid(float z) { return 1.f / (1.f + expf(-z)); }

template <class T, int VEC>
__global__ void groupnorm_stats_kernel(float* __restrict__ mean, float* __restrict__ rstd, const T* __restrict__ x,
                                       int64_t M, float eps) {
  using P = Pack<T, VEC>;
  const P* xg = reinterpret_cast<const P*>(x + int64_t(blockIdx.x) * M);
  const int64_t packs = M / VEC;
  float sum = 0.f;
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    const P xv = xg[p];
#pragma unroll
    for (int j = 0; j < VEC; ++j) sum += to_f(xv.v[j]);
  }
  const float m = block_sum(sum) / float(M);
  float sq = 0.f;
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    const P xv = xg[p];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float d = to_f(xv.v[j]) - m;
      sq += d * d;
    }
  }
  const float var = block_sum(sq) / float(M);
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = m;
    rstd[blockIdx.x] = rsqrtf(var + eps);
  }
}

template <class T, int VEC>
__global__ void groupnorm_apply_kernel(T* __restrict__ y, const T* __restrict__ x, const float* __restrict__ mean,
                                       const float* __restrict__ rstd, const T* __restrict__ weight,
                                       const T* __restrict__ bias, int64_t total_packs, int64_t HW, int C, int Cg,
                                       bool silu) {
  using P = Pack<T, VEC>;
  const P* xp = reinterpret_cast<const P*>(x);
  P* yp = reinterpret_cast<P*>(y);
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < total_packs;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t nc = p * VEC / HW;  // n * C + c
    const int c = int(nc % C);
    const int64_t ng = nc / Cg;  // n * G + c / Cg
    const float m = mean[ng], r = rstd[ng], w = to_f(weight[c]), b = to_f(bias[c]);
    const P xv = xp[p];
    P out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float z = (to_f(xv.v[j]) - m) * r * w + b;
      out.v[j] = from_f<T>(silu ? z * sigmoid(z) : z);
    }
    yp[p] = out;
  }
}

// dL/dz from dL/dy: the pre-activation z is recomputed from the normalised value.
__device__ __forceinline__ float grad_pre_activation(float dy, float xhat, float w, float b, bool silu) {
  if (!silu) return dy;
  const float z = xhat * w + b, s = sigmoid(z);
  return dy * s * (1.f + z * (1.f - s));
}

template <class T, int VEC>
__global__ void groupnorm_backward_kernel(T* __restrict__ dx, float* __restrict__ dweight, float* __restrict__ dbias,
                                          const T* __restrict__ dy, const T* __restrict__ x,
                                          const T* __restrict__ weight, const T* __restrict__ bias,
                                          const float* __restrict__ mean, const float* __restrict__ rstd, int G,
                                          int Cg, int64_t HW, bool silu) {
  using P = Pack<T, VEC>;
  const int64_t ng = blockIdx.x;
  const int c0 = int(ng % G) * Cg;
  const int64_t base = ng * Cg * HW;
  const int64_t packs = HW / VEC;
  const float m = mean[ng], r = rstd[ng];

  // Every thread receives each block_sum result, so all threads carry the same group sums.
  float g_sum = 0.f, gx_sum = 0.f;
  for (int ci = 0; ci < Cg; ++ci) {
    const int c = c0 + ci;
    const float w = to_f(weight[c]), b = to_f(bias[c]);
    const P* xp = reinterpret_cast<const P*>(x + base + ci * HW);
    const P* dyp = reinterpret_cast<const P*>(dy + base + ci * HW);
    float dz_sum = 0.f, dzx_sum = 0.f;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      const P xv = xp[p], dv = dyp[p];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xhat = (to_f(xv.v[j]) - m) * r;
        const float dz = grad_pre_activation(to_f(dv.v[j]), xhat, w, b, silu);
        dz_sum += dz;
        dzx_sum += dz * xhat;
      }
    }
    dz_sum = block_sum(dz_sum);
    dzx_sum = block_sum(dzx_sum);
    if (threadIdx.x == 0) {
      atomicAdd(dbias + c, dz_sum);
      atomicAdd(dweight + c, dzx_sum);
    }
    g_sum += w * dz_sum;
    gx_sum += w * dzx_sum;
  }
  const float inv_m = 1.f / float(int64_t(Cg) * HW);
  const float g_mean = g_sum * inv_m, gx_mean = gx_sum * inv_m;

  for (int ci = 0; ci < Cg; ++ci) {
    const int c = c0 + ci;
    const float w = to_f(weight[c]), b = to_f(bias[c]);
    const P* xp = reinterpret_cast<const P*>(x + base + ci * HW);
    const P* dyp = reinterpret_cast<const P*>(dy + base + ci * HW);
    P* dxp = reinterpret_cast<P*>(dx + base + ci * HW);
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      const P xv = xp[p], dv = dyp[p];
      P out;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xhat = (to_f(xv.v[j]) - m) * r;
        const float dz = grad_pre_activation(to_f(dv.v[j]), xhat, w, b, silu);
        out.v[j] = from_f<T>(r * (dz * w - g_mean - xhat * gx_mean));
      }
      dxp[p] = out;
    }
  }
}

constexpr int kApplyThreads = 256;
constexpr int kMaxBlockThreads = 512;

// Threads for a block that reduces `packs` packs: a multiple of 32, no more than there is work for.
int block_threads(int64_t packs) {
  return int(std::clamp<int64_t>((packs + 31) / 32 * 32, 32, kMaxBlockThreads));
}

template <class T, int VEC>
void launch_forward(StreamHandle s, T* y, float* mean, float* rstd, const T* x, const T* w, const T* b, int64_t N,
                    int64_t C, int64_t HW, int64_t G, float eps, bool silu) {
  const int64_t Cg = C / G, M = Cg * HW;
  groupnorm_stats_kernel<T, VEC><<<unsigned(N * G), block_threads(M / VEC), 0, s>>>(mean, rstd, x, M, eps);
  const int64_t total_packs = N * C * HW / VEC;
  const int64_t grid = std::min<int64_t>((total_packs + kApplyThreads - 1) / kApplyThreads, 65535 * 8);
  groupnorm_apply_kernel<T, VEC><<<unsigned(grid), kApplyThreads, 0, s>>>(y, x, mean, rstd, w, b, total_packs, HW,
                                                                          int(C), int(Cg), silu);
}

template <class T, int VEC>
void launch_backward(StreamHandle s, T* dx, float* dw, float* db, const T* dy, const T* x, const T* w, const T* b,
                     const float* mean, const float* rstd, int64_t N, int64_t C, int64_t HW, int64_t G, bool silu) {
  groupnorm_backward_kernel<T, VEC><<<unsigned(N * G), block_threads(HW / VEC), 0, s>>>(
      dx, dw, db, dy, x, w, b, mean, rstd, int(G), int(C / G), HW, silu);
}

void check_sizes(int64_t N, int64_t C, int64_t HW, int64_t G) {
  ZP_CHECK(N >= 0 && C > 0 && HW > 0 && G > 0 && C % G == 0, "N=", N, " C=", C, " HW=", HW, " G=", G);
  ZP_CHECK(C <= std::numeric_limits<int32_t>::max() && N * G <= std::numeric_limits<int32_t>::max(), "N=", N,
           " C=", C, " G=", G);
}

}  // namespace

void groupnorm_forward(StreamHandle s, DType dt, void* y, float* mean, float* rstd, const void* x, const void* weight,
                       const void* bias, int64_t N, int64_t C, int64_t HW, int64_t G, float eps, bool silu) {
  check_sizes(N, C, HW, G);
  ZP_CHECK(mean && rstd && weight && bias);
  if (N == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    auto* py = static_cast<T*>(y);
    auto* px = static_cast<const T*>(x);
    auto* w = static_cast<const T*>(weight);
    auto* b = static_cast<const T*>(bias);
    if (can_vectorise<T>(HW, {y, x}))
      launch_forward<T, 16 / sizeof(T)>(s, py, mean, rstd, px, w, b, N, C, HW, G, eps, silu);
    else
      launch_forward<T, 1>(s, py, mean, rstd, px, w, b, N, C, HW, G, eps, silu);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

void groupnorm_backward(StreamHandle s, DType dt, void* dx, float* dweight, float* dbias, const void* dy, const void* x,
                        const void* weight, const void* bias, const float* mean, const float* rstd, int64_t N,
                        int64_t C, int64_t HW, int64_t G, bool silu) {
  check_sizes(N, C, HW, G);
  ZP_CHECK(dweight && dbias && weight && bias && mean && rstd);
  if (N == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    auto* pdx = static_cast<T*>(dx);
    auto* pdy = static_cast<const T*>(dy);
    auto* px = static_cast<const T*>(x);
    auto* w = static_cast<const T*>(weight);
    auto* b = static_cast<const T*>(bias);
    if (can_vectorise<T>(HW, {dx, dy, x}))
      launch_backward<T, 16 / sizeof(T)>(s, pdx, dweight, dbias, pdy, px, w, b, mean, rstd, N, C, HW, G, silu);
    else
      launch_backward<T, 1>(s, pdx, dweight, dbias, pdy, px, w, b, mean, rstd, N, C, HW, G, silu);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace zp::kernels::cuda
