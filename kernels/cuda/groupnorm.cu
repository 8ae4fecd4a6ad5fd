// GroupNorm (+ optional SiLU) for channels-last images x[N, HW, C], fp32 statistics whatever the
// storage type. The trick: a group's channels are a short run of each pixel's row, so no block can own
// a group the way NCHW allowed; instead blocks own a chunk of rows of one sample and read whole rows
// (16-byte packs across the row, coalesced), keeping per-channel sums, and the groups' statistics are
// assembled from those per-channel partial sums by a small second kernel. Every sum is taken in a
// fixed order (no atomics), so results are deterministic.
// The forward's statistics never subtract two large sums: a thread sums x - K over its few rows, K its
// own first value, and turns that into its rows' mean and squared deviations (M2); those merge per
// channel and chunk, then per group, with Chan's formula (M2 = sum of the parts' M2 + count * (part
// mean - mean)^2), so a mean far from zero costs no precision.
//   forward:  partials (mean, M2 per channel and chunk) -> finalize (mean, rstd per group; mean and
//             rstd * weight per channel) -> apply (y = (x - mean) * scale + bias).
//   backward: partials (sum of dz, of dz * xhat per channel and chunk) -> finalize (the group means that
//             dx needs; dweight, dbias) -> apply (dx).
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/scratch.cuh"
#include "kernels/groupnorm.h"

namespace zp::kernels::cuda {
namespace {

__device__ __forceinline__ float sigmoid(float z) { return 1.f / (1.f + expf(-z)); }

// dL/dz from dL/dy: the pre-activation z is recomputed from the normalised value.
__device__ __forceinline__ float grad_pre_activation(float dy, float xhat, float w, float b, bool silu) {
  if (!silu) return dy;
  const float z = xhat * w + b, s = sigmoid(z);
  return dy * s * (1.f + z * (1.f - s));
}

// How the work splits: blocks of (TX column packs) x (TY rows), at most kThreads threads, one block
// per chunk of rows of one sample. A thread holds a pack's worth of sums or coefficients (tens of
// registers), so blocks of 480 threads ran one an SM and left the loads too few to hide latency.
constexpr int kThreads = 256;
struct Split {
  int tx, ty;
  int64_t chunks, rows_per_chunk;
  dim3 grid(int64_t N) const { return dim3(unsigned(chunks), unsigned(N)); }
  dim3 block() const { return dim3(unsigned(tx), unsigned(ty)); }
  // The partial-sum kernel's shared memory: a float2 per channel of each thread's pack.
  size_t partials_smem(int vec) const { return size_t(tx) * ty * vec * sizeof(float2); }
};

Split split_for(int64_t N, int64_t HW, int64_t CP) {
  Split s;
  s.tx = int(std::min<int64_t>(CP, kThreads));
  s.ty = std::max(1, kThreads / s.tx);
  const int64_t want = ceil_div(int64_t(2) * sm_count(), std::max<int64_t>(N, 1));
  s.chunks = std::max<int64_t>(1, std::min<int64_t>(want, ceil_div(HW, int64_t(s.ty) * 4)));
  s.rows_per_chunk = ceil_div(HW, s.chunks);
  s.chunks = ceil_div(HW, s.rows_per_chunk);
  return s;
}

// Rows a thread at row offset `ty` of TY visits among `rows`.
__device__ __forceinline__ int64_t rows_of(int64_t rows, int ty, int TY) {
  return rows > ty ? (rows - ty + TY - 1) / TY : 0;
}

// part[(n * chunks + chunk) * C + c] = for channel c over the chunk's rows:
//   forward  (mean, M2);
//   backward (sum of dz, sum of dz * xhat), from mean[n * G + g] and rstd[n * G + g].

template <class T, int VEC, bool BACKWARD>
__global__ void __launch_bounds__(kThreads)
    groupnorm_partials_kernel(float2* __restrict__ part, const T* __restrict__ x, const T* __restrict__ dy,
                              const float* __restrict__ mean, const float* __restrict__ rstd,
                              const T* __restrict__ weight, const T* __restrict__ bias, int64_t HW, int C, int Cg,
                              int64_t rows_per_chunk, bool silu) {
  extern __shared__ float2 red[];  // [ty][tx * VEC]
  using P = Pack<T, VEC>;
  const int64_t n = blockIdx.y, chunk = blockIdx.x, chunks = gridDim.x;
  const int G = C / Cg, CP = C / VEC, tx = threadIdx.x, ty = threadIdx.y, TX = blockDim.x, TY = blockDim.y;
  const int64_t r0 = chunk * rows_per_chunk, r1 = min(HW, r0 + rows_per_chunk);
  const T* xs = x + n * HW * C;
  const T* dys = BACKWARD ? dy + n * HW * C : nullptr;
  for (int cp0 = 0; cp0 < CP; cp0 += TX) {
    const int cp = cp0 + tx;
    float a[VEC] = {}, b[VEC] = {};
    if (cp < CP) {
      float k[VEC] = {}, m[VEC], r[VEC], w[VEC], bb[VEC];
      if constexpr (BACKWARD) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const int c = cp * VEC + j, g = c / Cg;
          m[j] = mean[n * G + g];
          r[j] = rstd[n * G + g];
          w[j] = to_f(weight[c]);
          bb[j] = to_f(bias[c]);
        }
      } else if (r0 + ty < r1) {
        const P first = reinterpret_cast<const P*>(xs + (r0 + ty) * C)[cp];
#pragma unroll
        for (int j = 0; j < VEC; ++j) k[j] = to_f(first.v[j]);
      }
#pragma unroll 4
      for (int64_t row = r0 + ty; row < r1; row += TY) {
        const P xv = reinterpret_cast<const P*>(xs + row * C)[cp];
        if constexpr (BACKWARD) {
          const P dv = reinterpret_cast<const P*>(dys + row * C)[cp];
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const float xhat = (to_f(xv.v[j]) - m[j]) * r[j];
            const float dz = grad_pre_activation(to_f(dv.v[j]), xhat, w[j], bb[j], silu);
            a[j] += dz;
            b[j] += dz * xhat;
          }
        } else {
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const float d = to_f(xv.v[j]) - k[j];
            a[j] += d;
            b[j] += d * d;
          }
        }
      }
      if constexpr (!BACKWARD) {  // this thread's rows: (mean, M2)
        const float cnt = float(rows_of(r1 - r0, ty, TY));
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float d = cnt > 0 ? a[j] / cnt : 0.f;
          b[j] = fmaxf(b[j] - a[j] * d, 0.f);
          a[j] = cnt > 0 ? k[j] + d : 0.f;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) red[ty * TX * VEC + tx * VEC + j] = make_float2(a[j], b[j]);
    __syncthreads();
    for (int i = ty * TX + tx; i < TX * VEC; i += TX * TY) {
      const int c = cp0 * VEC + i;
      if (c >= C) continue;
      float2 t = make_float2(0.f, 0.f);
      if constexpr (BACKWARD) {
        for (int y = 0; y < TY; ++y) {
          const float2 v = red[y * TX * VEC + i];
          t.x += v.x;
          t.y += v.y;
        }
      } else {  // Chan: the chunk's mean, then M2 = sum of the rows' M2 + count * (their mean - mean)^2
        for (int y = 0; y < TY; ++y) t.x += float(rows_of(r1 - r0, y, TY)) * red[y * TX * VEC + i].x;
        t.x /= float(r1 - r0);
        for (int y = 0; y < TY; ++y) {
          const float2 v = red[y * TX * VEC + i];
          const float d = v.x - t.x;
          t.y += v.y + float(rows_of(r1 - r0, y, TY)) * d * d;
        }
      }
      part[(n * chunks + chunk) * C + c] = t;
    }
    __syncthreads();
  }
}

// The sums of a group (n, g) over its channels and every chunk, each channel weighted by
// channel_weight (null: 1); every thread receives both.
__device__ __forceinline__ float2 group_sums(const float2* part, const float* channel_weight, int64_t n, int g, int C,
                                             int Cg, int64_t chunks) {
  float sa = 0.f, sb = 0.f;
  for (int64_t i = threadIdx.x; i < int64_t(Cg) * chunks; i += blockDim.x) {
    const int ci = int(i % Cg);
    const int64_t k = i / Cg;
    const float2 v = part[(n * chunks + k) * C + g * Cg + ci];
    const float w = channel_weight ? channel_weight[ci] : 1.f;
    sa += w * v.x;
    sb += w * v.y;
  }
  return make_float2(block_sum(sa), block_sum(sb));
}

// Block (n, g): the group's mean and M2 from its chunks' (mean, M2) by Chan's formula, then
// mean[n * G + g], rstd[n * G + g] and coef[n * C + c] = (mean, rstd * weight[c]) for its channels.
template <class T>
__global__ void groupnorm_forward_finalize_kernel(float2* __restrict__ coef, float* __restrict__ mean,
                                                  float* __restrict__ rstd, const float2* __restrict__ part,
                                                  const T* __restrict__ weight, int64_t HW, int C, int Cg,
                                                  int64_t chunks, int64_t rows_per_chunk, float eps) {
  const int G = C / Cg, g = int(blockIdx.x % G);
  const int64_t n = blockIdx.x / G;
  auto rows = [&](int64_t k) { return float(min(HW, (k + 1) * rows_per_chunk) - k * rows_per_chunk); };
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < int64_t(Cg) * chunks; i += blockDim.x) {
    const int64_t k = i / Cg;
    s += rows(k) * part[(n * chunks + k) * C + g * Cg + int(i % Cg)].x;
  }
  const float M = float(int64_t(Cg) * HW), m = block_sum(s) / M;
  float q = 0.f;
  for (int64_t i = threadIdx.x; i < int64_t(Cg) * chunks; i += blockDim.x) {
    const int64_t k = i / Cg;
    const float2 v = part[(n * chunks + k) * C + g * Cg + int(i % Cg)];
    q += v.y + rows(k) * (v.x - m) * (v.x - m);
  }
  const float r = rsqrtf(block_sum(q) / M + eps);
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = m;
    rstd[blockIdx.x] = r;
  }
  for (int ci = threadIdx.x; ci < Cg; ci += blockDim.x)
    coef[n * C + g * Cg + ci] = make_float2(m, r * to_f(weight[g * Cg + ci]));
}

// y = (x - mean) * scale + bias (through SiLU when asked), coef[n * C + c] = (mean, scale); the same
// blocks as groupnorm_partials_kernel, each thread holding its channels' coefficients across its rows.
template <class T, int VEC>
__global__ void __launch_bounds__(kThreads)
    groupnorm_forward_apply_kernel(T* __restrict__ y, const T* __restrict__ x, const float2* __restrict__ coef,
                                   const T* __restrict__ bias, int64_t HW, int C, int64_t rows_per_chunk, bool silu) {
  using P = Pack<T, VEC>;
  const int64_t n = blockIdx.y, r0 = blockIdx.x * rows_per_chunk, r1 = min(HW, r0 + rows_per_chunk);
  const int CP = C / VEC;
  for (int cp = threadIdx.x; cp < CP; cp += blockDim.x) {
    float m[VEC], sc[VEC], b[VEC];
    const P bv = reinterpret_cast<const P*>(bias)[cp];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float2 k = coef[n * C + cp * VEC + j];
      m[j] = k.x;
      sc[j] = k.y;
      b[j] = to_f(bv.v[j]);
    }
#pragma unroll 4
    for (int64_t row = r0 + threadIdx.y; row < r1; row += blockDim.y) {
      const int64_t at = (n * HW + row) * CP + cp;
      const P xv = reinterpret_cast<const P*>(x)[at];
      P out;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float z = (to_f(xv.v[j]) - m[j]) * sc[j] + b[j];
        out.v[j] = from_f<T>(silu ? z * sigmoid(z) : z);
      }
      reinterpret_cast<P*>(y)[at] = out;
    }
  }
}

// Blocks [0, N * G): block (n, g) writes bstats[n * G + g] = (mean, rstd, mean of weight * dz, mean of
// weight * dz * xhat). Blocks after them: one channel a warp, dweight[c] += sum of dz * xhat and
// dbias[c] += sum of dz over samples and chunks.
template <class T>
__global__ void groupnorm_backward_finalize_kernel(float4* __restrict__ bstats, float* __restrict__ dweight,
                                                   float* __restrict__ dbias, const float2* __restrict__ part,
                                                   const float* __restrict__ mean, const float* __restrict__ rstd,
                                                   const T* __restrict__ weight, int64_t N, int64_t HW, int C, int Cg,
                                                   int64_t chunks) {
  const int G = C / Cg;
  if (blockIdx.x < N * G) {
    __shared__ float wg[1024];  // the group's weights
    const int g = int(blockIdx.x % G);
    const int64_t n = blockIdx.x / G;
    for (int ci = threadIdx.x; ci < Cg; ci += blockDim.x) wg[ci] = to_f(weight[g * Cg + ci]);
    __syncthreads();
    const float2 sums = group_sums(part, wg, n, g, C, Cg, chunks);
    const float inv_m = 1.f / float(int64_t(Cg) * HW);
    if (threadIdx.x == 0)
      bstats[blockIdx.x] = make_float4(mean[blockIdx.x], rstd[blockIdx.x], sums.x * inv_m, sums.y * inv_m);
    return;
  }
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const int64_t c = (blockIdx.x - N * G) * warps + (threadIdx.x >> 5);
  if (c >= C) return;
  float sa = 0.f, sb = 0.f;
  for (int64_t i = lane; i < N * chunks; i += 32) {
    const float2 v = part[i * C + c];
    sa += v.x;
    sb += v.y;
  }
  sa = warp_sum(sa);
  sb = warp_sum(sb);
  if (lane == 0) {
    dbias[c] += sa;
    dweight[c] += sb;
  }
}

// dx = rstd * (dz * weight - mean(weight dz) - xhat * mean(weight dz xhat)); blocks as in groupnorm_partials_kernel.
template <class T, int VEC>
__global__ void __launch_bounds__(kThreads)
    groupnorm_backward_apply_kernel(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x,
                                    const float4* __restrict__ bstats, const T* __restrict__ weight,
                                    const T* __restrict__ bias, int64_t HW, int C, int Cg, int64_t rows_per_chunk,
                                    bool silu) {
  using P = Pack<T, VEC>;
  const int64_t n = blockIdx.y, r0 = blockIdx.x * rows_per_chunk, r1 = min(HW, r0 + rows_per_chunk);
  const int CP = C / VEC, G = C / Cg;
  for (int cp = threadIdx.x; cp < CP; cp += blockDim.x) {
    float4 st[VEC];
    float w[VEC], b[VEC];
    const P wv = reinterpret_cast<const P*>(weight)[cp], bv = reinterpret_cast<const P*>(bias)[cp];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      st[j] = bstats[n * G + (cp * VEC + j) / Cg];
      w[j] = to_f(wv.v[j]);
      b[j] = to_f(bv.v[j]);
    }
#pragma unroll 2
    for (int64_t row = r0 + threadIdx.y; row < r1; row += blockDim.y) {
      const int64_t at = (n * HW + row) * CP + cp;
      const P xv = reinterpret_cast<const P*>(x)[at], dv = reinterpret_cast<const P*>(dy)[at];
      P out;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xhat = (to_f(xv.v[j]) - st[j].x) * st[j].y;
        const float dz = grad_pre_activation(to_f(dv.v[j]), xhat, w[j], b[j], silu);
        out.v[j] = from_f<T>(st[j].y * (dz * w[j] - st[j].z - xhat * st[j].w));
      }
      reinterpret_cast<P*>(dx)[at] = out;
    }
  }
}

void check_sizes(int64_t N, int64_t C, int64_t HW, int64_t G) {
  ZP_CHECK(N >= 0 && C > 0 && HW > 0 && G > 0 && C % G == 0, "N=", N, " C=", C, " HW=", HW, " G=", G);
  ZP_CHECK(N <= 65535 && C / G <= 1024 && N * G < (int64_t(1) << 30), "groupnorm: N=", N, " C=", C, " G=", G,
           " too large");
}

}  // namespace

void groupnorm_forward(StreamHandle s, DType dt, void* y, float* mean, float* rstd, const void* x, const void* weight,
                       const void* bias, int64_t N, int64_t C, int64_t HW, int64_t G, float eps, bool silu) {
  check_sizes(N, C, HW, G);
  if (N == 0) return;
  const int Cg = int(C / G);
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    with_pack_width<T>(C, {x, y, bias}, [&](auto vec) {
      constexpr int VEC = decltype(vec)::value;
      const Split sp = split_for(N, HW, C / VEC);
      KernelScratch part(s, size_t(N * sp.chunks * C) * sizeof(float2), "groupnorm");
      KernelScratch coef(s, size_t(N * C) * sizeof(float2), "groupnorm");
      groupnorm_partials_kernel<T, VEC, false><<<sp.grid(N), sp.block(), sp.partials_smem(VEC), s>>>(
          part.as<float2>(), static_cast<const T*>(x), nullptr, nullptr, nullptr, nullptr, nullptr, HW, int(C), Cg,
          sp.rows_per_chunk, silu);
      groupnorm_forward_finalize_kernel<T><<<unsigned(N * G), 256, 0, s>>>(
          coef.as<float2>(), mean, rstd, part.as<float2>(), static_cast<const T*>(weight), HW, int(C), Cg, sp.chunks,
          sp.rows_per_chunk, eps);
      groupnorm_forward_apply_kernel<T, VEC>
          <<<sp.grid(N), sp.block(), 0, s>>>(static_cast<T*>(y), static_cast<const T*>(x), coef.as<float2>(),
                                             static_cast<const T*>(bias), HW, int(C), sp.rows_per_chunk, silu);
    });
  });
  ZP_CUDA_LAUNCH_CHECK();
}

void groupnorm_backward(StreamHandle s, DType dt, void* dx, float* dweight, float* dbias, const void* dy, const void* x,
                        const void* weight, const void* bias, const float* mean, const float* rstd, int64_t N,
                        int64_t C, int64_t HW, int64_t G, bool silu) {
  check_sizes(N, C, HW, G);
  if (N == 0) return;
  const int Cg = int(C / G);
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    with_pack_width<T>(C, {x, dx, dy, weight, bias}, [&](auto vec) {
      constexpr int VEC = decltype(vec)::value;
      const Split sp = split_for(N, HW, C / VEC);
      KernelScratch part(s, size_t(N * sp.chunks * C) * sizeof(float2), "groupnorm");
      KernelScratch bstats(s, size_t(N * G) * sizeof(float4), "groupnorm");
      groupnorm_partials_kernel<T, VEC, true><<<sp.grid(N), sp.block(), sp.partials_smem(VEC), s>>>(
          part.as<float2>(), static_cast<const T*>(x), static_cast<const T*>(dy), mean, rstd,
          static_cast<const T*>(weight), static_cast<const T*>(bias), HW, int(C), Cg, sp.rows_per_chunk, silu);
      groupnorm_backward_finalize_kernel<T><<<unsigned(N * G + ceil_div(C, 8)), 256, 0, s>>>(
          bstats.as<float4>(), dweight, dbias, part.as<float2>(), mean, rstd, static_cast<const T*>(weight), N, HW,
          int(C), Cg, sp.chunks);
      groupnorm_backward_apply_kernel<T, VEC><<<sp.grid(N), sp.block(), 0, s>>>(
          static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x), bstats.as<float4>(),
          static_cast<const T*>(weight), static_cast<const T*>(bias), HW, int(C), Cg, sp.rows_per_chunk, silu);
    });
  });
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace zp::kernels::cuda
