// Helpers for the CUDA kernels: device element types, load/store as float, warp reductions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "core/cuda_check.h"
#include "core/dtype.h"

namespace zp::kernels::cuda {

// Map the host dtype to the CUDA element type.
template <class T> struct DevType { using type = T; };
template <> struct DevType<::zp::bf16> { using type = __nv_bfloat16; };
template <> struct DevType<::zp::f16> { using type = __half; };

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(double x) { return float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <class T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ double from_f<double>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// A warp reduction (warp_sum, warp_max) over a block whose size is a multiple of 32 (at most 1024);
// every thread gets the result. `identity` fills the missing warps.
template <float (*WarpOp)(float)>
__device__ __forceinline__ float block_reduce(float v, float identity) {
  __shared__ float shared[32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpOp(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  int nwarps = (blockDim.x + 31) >> 5;
  v = lane < nwarps ? shared[lane] : identity;
  return WarpOp(v);
}
__device__ __forceinline__ float block_sum(float v) { return block_reduce<warp_sum>(v, 0.f); }
__device__ __forceinline__ float block_max(float v) { return block_reduce<warp_max>(v, -INFINITY); }

// A row reduced by a whole block or by one warp (the norm kernels pick per row width).
template <bool kBlockPerRow>
__device__ __forceinline__ float row_sum(float v) {
  if constexpr (kBlockPerRow) return block_sum(v);
  else return warp_sum(v);
}

// Online softmax statistics: a running max and the sum of exp(x - max), merged across threads
// without a second pass over the row (softmax and cross-entropy).
struct MaxSum {
  float m, s;  // running max and sum of exp(x - m)
};

__device__ __forceinline__ MaxSum maxsum_merge(MaxSum a, MaxSum b) {
  float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.f};
  return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}
__device__ __forceinline__ MaxSum add_value(MaxSum a, float x) {
  if (x == -INFINITY) return a;
  if (x > a.m) return {x, a.s * __expf(a.m - x) + 1.f};
  return {a.m, a.s + __expf(x - a.m)};
}
__device__ __forceinline__ MaxSum warp_merge(MaxSum v) {
  for (int o = 16; o > 0; o >>= 1)
    v = maxsum_merge(v, {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)});
  return v;
}
__device__ __forceinline__ MaxSum block_merge(MaxSum v) {
  __shared__ MaxSum shared[32];  // a block size that is a multiple of 32
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_merge(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < int(blockDim.x >> 5) ? shared[lane] : MaxSum{-INFINITY, 0.f};
  return warp_merge(v);
}

inline unsigned ceil_div(long long a, long long b) { return unsigned((a + b - 1) / b); }

// VEC consecutive elements moved as one load/store.
template <class T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

// Whether rows of `width` elements of T can move as 16-byte packs: the width divides and every
// (non-null) pointer is 16-byte aligned.
template <class T>
bool can_vectorise(int64_t width, std::initializer_list<const void*> ptrs) {
  constexpr int vec = 16 / int(sizeof(T));
  if (width % vec != 0) return false;
  for (const void* p : ptrs)
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// Calls f(std::integral_constant<int, VEC>{}) with VEC = 16 / sizeof(T) where can_vectorise(width,
// ptrs) holds, else VEC = 1: one launch written for both pack widths.
template <class T, class F>
void with_pack_width(int64_t width, std::initializer_list<const void*> ptrs, F&& f) {
  if (can_vectorise<T>(width, ptrs))
    f(std::integral_constant<int, 16 / int(sizeof(T))>{});
  else
    f(std::integral_constant<int, 1>{});
}

// Multiprocessors of the current device (cached per device).
inline int sm_count() {
  static int cached[64] = {0};
  int dev = 0;
  ZP_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 64 && cached[dev]) return cached[dev];
  int sms = 0;
  ZP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (dev < 64) cached[dev] = sms;
  return sms;
}

// Programmatic dependent launch (sm_90 and later), which removes the gap between two short kernels
// of a decode step: a kernel launched with launch_dependent() may start while the kernel before it on
// the stream still runs, once every block of that one has called pdl_launch_dependents() (or ended).
// It must call pdl_wait() before it touches anything the kernel before wrote or reads; every thread of
// it calls pdl_wait() exactly once, so that it cannot finish before its predecessor (the kernels after
// it are launched plainly and count on that). Both are no-ops on older GPUs and in plain launches.
// What the kernels ahead write must not reach such a kernel through `const T* __restrict__` (nor
// beside restrict-qualified outputs that let nvcc prove it read-only): nvcc loads those with
// ld.global.nc, which promises memory no grid changes while this one lives, and ptxas then schedules
// them ahead of the wait (seen in row_linear's SASS: the x loads moved above ACQBULK and decode read
// the previous kernel's output half-written). Only inputs fixed for the whole step (weights) may be
// restrict-qualified.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// The current device's compute capability major version, asked once per device (kernels choose
// paths by it: 8 for mma.sync and cp.async, 9 for programmatic launches and thread-block clusters).
inline int device_compute_major() {
  static std::atomic<int> cached[64] = {};  // 0: not asked yet
  int dev = 0;
  ZP_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 64 && cached[dev]) return cached[dev];
  int major = 0;
  ZP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (dev < 64) cached[dev] = major;
  return major;
}

// Whether launch_dependent() launches programmatically on the current device: compute capability 9
// or later, and ZP_PDL not "0" (to measure without).
inline bool programmatic_launch_enabled() {
  static const bool allowed = [] {
    const char* v = std::getenv("ZP_PDL");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return allowed && device_compute_major() >= 9;
}

template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                      Args&&... args) {
  if (!s || !programmatic_launch_enabled()) {  // the legacy default stream synchronises anyway
    kernel<<<grid, block, smem, s>>>(std::forward<Args>(args)...);
    return;
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  ZP_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// Lets `kernel` launch with `bytes` of dynamic shared memory. The default limit (48 KiB) covers the
// kernel's static and dynamic shared memory together, so the opt-in is needed as soon as their sum
// passes it, not only when the dynamic part alone does.
template <class Kernel>
void allow_dynamic_smem(Kernel kernel, size_t bytes, const char* what) {
  cudaFuncAttributes attr{};
  ZP_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  if (attr.sharedSizeBytes + bytes <= 48 * 1024) return;
  int dev = 0, max_optin = 0;
  ZP_CUDA_CHECK(cudaGetDevice(&dev));
  ZP_CUDA_CHECK(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  ZP_CHECK(attr.sharedSizeBytes + bytes <= size_t(max_optin), what, " needs ", attr.sharedSizeBytes + bytes,
           " bytes of shared memory; this device allows ", max_optin);
  ZP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace zp::kernels::cuda

// Dispatch the dtypes the CUDA kernels support to the device element type T.
#define ZP_CUDA_DISPATCH_FLOAT(dt, T, ...)                                     \
  [&] {                                                                        \
    switch (dt) {                                                              \
      case ::zp::DType::F32: { using T = float; return __VA_ARGS__(); }        \
      case ::zp::DType::BF16: { using T = __nv_bfloat16; return __VA_ARGS__(); } \
      case ::zp::DType::F16: { using T = __half; return __VA_ARGS__(); }       \
      default: ZP_FATAL("unsupported dtype ", ::zp::dtype_name(dt), " for a CUDA float op"); \
    }                                                                          \
  }()
