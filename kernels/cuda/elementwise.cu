// Grid-stride elementwise kernels; math in fp32 whatever the storage type.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/elementwise.h"

namespace zp::kernels::cuda {
namespace {

template <class D, class S>
__global__ void cast_kernel(D* dst, const S* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = from_f<D>(to_f(src[i]));
}
template <class T>
__global__ void scale_kernel(T* y, const T* x, float alpha, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = from_f<T>(alpha * to_f(x[i]));
}
template <class T>
__global__ void add_kernel(T* z, const T* x, const T* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    z[i] = from_f<T>(to_f(x[i]) + to_f(y[i]));
}
template <class T>
__global__ void axpy_kernel(T* y, float alpha, const T* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = from_f<T>(to_f(y[i]) + alpha * to_f(x[i]));
}
template <class T>
__global__ void fill_kernel(T* y, float v, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = from_f<T>(v);
}

unsigned grid_for(int64_t n) {
  long long blocks = (n + 255) / 256;
  return unsigned(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

}  // namespace

void cast(StreamHandle s, DType dst_dt, void* dst, DType src_dt, const void* src, int64_t n) {
  if (n == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dst_dt, D, [&] {
    ZP_CUDA_DISPATCH_FLOAT(src_dt, S, [&] {
      cast_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<D*>(dst), static_cast<const S*>(src), n);
    });
  });
  ZP_CUDA_LAUNCH_CHECK();
}

void scale(StreamHandle s, DType dt, void* y, const void* x, float alpha, int64_t n) {
  if (n == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    scale_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<T*>(y), static_cast<const T*>(x), alpha, n);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

void add(StreamHandle s, DType dt, void* z, const void* x, const void* y, int64_t n) {
  if (n == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    add_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<T*>(z), static_cast<const T*>(x),
                                           static_cast<const T*>(y), n);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

void axpy(StreamHandle s, DType dt, void* y, float alpha, const void* x, int64_t n) {
  if (n == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    axpy_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<T*>(y), alpha, static_cast<const T*>(x), n);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

void fill(StreamHandle s, DType dt, void* y, float value, int64_t n) {
  if (n == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] { fill_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<T*>(y), value, n); });
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace zp::kernels::cuda
