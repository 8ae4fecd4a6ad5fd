// Row softmax. Each thread keeps an online (max, sum) pair over its columns, so pass one reads the
// row once; the pairs are merged by rescaling sums to the larger max. Short rows get a warp each,
// long rows a whole block. A thread only ever touches the columns it read in pass one, so y may
// alias x (and dx may alias dy) without extra synchronisation.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/softmax.h"

namespace zp::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kWarpRowMaxC = 1024;  // rows up to this length get one warp each


// WHOLE_BLOCK: one row per block; otherwise one row per warp.
template <class T, bool WHOLE_BLOCK>
__global__ void softmax_forward_kernel(T* y, const T* x, int64_t N, int64_t C, float scale, int64_t causal_T) {
  int64_t row = WHOLE_BLOCK ? int64_t(blockIdx.x) : int64_t(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (row >= N) return;  // uniform per warp; the block version launches exactly N blocks
  int tid = WHOLE_BLOCK ? threadIdx.x : (threadIdx.x & 31);
  int stride = WHOLE_BLOCK ? blockDim.x : 32;
  const T* xr = x + row * C;
  T* yr = y + row * C;
  int64_t visible = causal_T > 0 ? min(C, row % causal_T + 1) : C;
  MaxSum ms{-INFINITY, 0.f};
  for (int64_t c = tid; c < visible; c += stride) ms = add_value(ms, scale * to_f(xr[c]));
  ms = WHOLE_BLOCK ? block_merge(ms) : warp_merge(ms);
  float inv = 1.f / ms.s;
  for (int64_t c = tid; c < C; c += stride)
    yr[c] = from_f<T>(c < visible ? __expf(scale * to_f(xr[c]) - ms.m) * inv : 0.f);
}

template <class T, bool WHOLE_BLOCK>
__global__ void softmax_backward_kernel(T* dx, const T* dy, const T* y, int64_t N, int64_t C, float scale) {
  int64_t row = WHOLE_BLOCK ? int64_t(blockIdx.x) : int64_t(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (row >= N) return;
  int tid = WHOLE_BLOCK ? threadIdx.x : (threadIdx.x & 31);
  int stride = WHOLE_BLOCK ? blockDim.x : 32;
  const T* yr = y + row * C;
  const T* dyr = dy + row * C;
  T* dxr = dx + row * C;
  float dot = 0.f;
  for (int64_t c = tid; c < C; c += stride) dot += to_f(dyr[c]) * to_f(yr[c]);
  dot = WHOLE_BLOCK ? block_sum(dot) : warp_sum(dot);
  for (int64_t c = tid; c < C; c += stride) {
    float yv = to_f(yr[c]);
    dxr[c] = from_f<T>(scale * yv * (to_f(dyr[c]) - dot));
  }
}

}  // namespace

void softmax_forward(StreamHandle s, DType dt, void* y, const void* x, int64_t N, int64_t C, float scale,
                     int64_t causal_T) {
  ZP_CHECK(N >= 0 && C > 0 && causal_T >= 0);
  if (N == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    auto* py = static_cast<T*>(y);
    auto* px = static_cast<const T*>(x);
    if (C <= kWarpRowMaxC)
      softmax_forward_kernel<T, false><<<ceil_div(N, kThreads / 32), kThreads, 0, s>>>(py, px, N, C, scale, causal_T);
    else
      softmax_forward_kernel<T, true><<<unsigned(N), kThreads, 0, s>>>(py, px, N, C, scale, causal_T);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

void softmax_backward(StreamHandle s, DType dt, void* dx, const void* dy, const void* y, int64_t N, int64_t C,
                      float scale) {
  ZP_CHECK(N >= 0 && C > 0);
  if (N == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    auto* pdx = static_cast<T*>(dx);
    auto* pdy = static_cast<const T*>(dy);
    auto* py = static_cast<const T*>(y);
    if (C <= kWarpRowMaxC)
      softmax_backward_kernel<T, false><<<ceil_div(N, kThreads / 32), kThreads, 0, s>>>(pdx, pdy, py, N, C, scale);
    else
      softmax_backward_kernel<T, true><<<unsigned(N), kThreads, 0, s>>>(pdx, pdy, py, N, C, scale);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace zp::kernels::cuda
