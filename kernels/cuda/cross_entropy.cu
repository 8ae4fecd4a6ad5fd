// Fused cross-entropy: one block per row, reading the (bf16) logits directly in 16-byte packs.
// Pass one keeps an online (max, sum of exp) per thread, taking one max per pack so there is one
// exponential per element, then merges the pairs across the block. The backward's write pass covers
// the whole padded row, so padding columns come out zero. Every thread writes only the elements it
// read, after the block-wide merge, so dlogits may alias logits. A target >= V cannot be reported
// from the device: it yields a NaN loss.
#include <cstdint>

#include "kernels/cross_entropy.h"
#include "kernels/cuda/cuda_common.cuh"

namespace zp::kernels::cuda {
namespace {

constexpr int kThreads = 512;


// logsumexp of x[0, V), the whole block cooperating; every thread gets the result.
template <class T, int VEC>
__device__ float row_logsumexp(const T* x, int64_t V) {
  MaxSum ms{-INFINITY, 0.f};
  int64_t n_packs = V / VEC;
  for (int64_t i = threadIdx.x; i < n_packs; i += blockDim.x) {
    Pack<T, VEC> p = reinterpret_cast<const Pack<T, VEC>*>(x)[i];
    float f[VEC];
    float pmax = -INFINITY;
#pragma unroll
    for (int k = 0; k < VEC; ++k) pmax = fmaxf(pmax, f[k] = to_f(p.v[k]));
    if (pmax == -INFINITY) continue;
    float m = fmaxf(ms.m, pmax);
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < VEC; ++k) sum += __expf(f[k] - m);
    ms = {m, ms.s * __expf(ms.m - m) + sum};
  }
  for (int64_t c = n_packs * VEC + threadIdx.x; c < V; c += blockDim.x) ms = maxsum_merge(ms, {to_f(x[c]), 1.f});
  ms = block_merge(ms);
  return ms.m + __logf(ms.s);
}

template <class T, int VEC>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_forward_kernel(float* losses, float* lse, const T* logits, const int32_t* targets, int64_t V,
                                 int64_t ld) {
  int64_t row = blockIdx.x;
  int32_t t = targets[row];
  if (t < 0) {  // uniform across the block, so returning before the block reduction is safe
    if (threadIdx.x == 0) {
      losses[row] = 0.f;
      if (lse) lse[row] = 0.f;
    }
    return;
  }
  const T* x = logits + row * ld;
  float l = row_logsumexp<T, VEC>(x, V);
  if (threadIdx.x == 0) {
    losses[row] = t < V ? l - to_f(x[t]) : NAN;
    if (lse) lse[row] = l;
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_backward_kernel(T* dlogits, const T* logits, const float* lse, const int32_t* targets,
                                  float dloss_scale, int64_t V, int64_t ld) {
  int64_t row = blockIdx.x;
  int32_t t = targets[row];
  const T* x = logits + row * ld;
  T* dx = dlogits + row * ld;
  float l = 0.f;
  if (t >= 0) l = lse ? lse[row] : row_logsumexp<T, VEC>(x, V);
  int64_t n_packs = ld / VEC;
  for (int64_t i = threadIdx.x; i < n_packs; i += blockDim.x) {
    Pack<T, VEC> p;
    if (t >= 0) p = reinterpret_cast<const Pack<T, VEC>*>(x)[i];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      int64_t c = i * VEC + k;
      float g = 0.f;
      if (t >= 0 && c < V) g = dloss_scale * (__expf(to_f(p.v[k]) - l) - (c == t ? 1.f : 0.f));
      p.v[k] = from_f<T>(g);
    }
    reinterpret_cast<Pack<T, VEC>*>(dx)[i] = p;
  }
  for (int64_t c = n_packs * VEC + threadIdx.x; c < ld; c += blockDim.x) {
    float g = 0.f;
    if (t >= 0 && c < V) g = dloss_scale * (__expf(to_f(x[c]) - l) - (c == t ? 1.f : 0.f));
    dx[c] = from_f<T>(g);
  }
}

// 16-byte packs when every row starts 16-byte aligned; otherwise element by element.
template <class T>
bool rows_are_16b_aligned(const void* p, int64_t ld) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (ld * int64_t(sizeof(T))) % 16 == 0;
}

}  // namespace

void cross_entropy_forward(StreamHandle s, DType dt, float* losses, float* lse, const void* logits,
                           const int32_t* targets, int64_t N, int64_t V, int64_t ld) {
  ZP_CHECK(N >= 0 && V > 0 && ld >= V);
  if (N == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    auto* x = static_cast<const T*>(logits);
    constexpr int VEC = 16 / sizeof(T);
    if (rows_are_16b_aligned<T>(logits, ld))
      cross_entropy_forward_kernel<T, VEC><<<unsigned(N), kThreads, 0, s>>>(losses, lse, x, targets, V, ld);
    else
      cross_entropy_forward_kernel<T, 1><<<unsigned(N), kThreads, 0, s>>>(losses, lse, x, targets, V, ld);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

void cross_entropy_backward(StreamHandle s, DType dt, void* dlogits, const void* logits, const float* lse,
                            const int32_t* targets, float dloss_scale, int64_t N, int64_t V, int64_t ld) {
  ZP_CHECK(N >= 0 && V > 0 && ld >= V);
  if (N == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    auto* x = static_cast<const T*>(logits);
    auto* dx = static_cast<T*>(dlogits);
    constexpr int VEC = 16 / sizeof(T);
    if (rows_are_16b_aligned<T>(logits, ld) && rows_are_16b_aligned<T>(dlogits, ld))
      cross_entropy_backward_kernel<T, VEC>
          <<<unsigned(N), kThreads, 0, s>>>(dx, x, lse, targets, dloss_scale, V, ld);
    else
      cross_entropy_backward_kernel<T, 1><<<unsigned(N), kThreads, 0, s>>>(dx, x, lse, targets, dloss_scale, V, ld);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace zp::kernels::cuda
