// Nearest 2x upsampling. Forward: one thread per pair of horizontally adjacent outputs, which are the
// same input value, so each thread reads one x and writes both children as one 2-element store (2W is
// even, so pairs never straddle rows and stay aligned). Backward: one thread per x, which reads its
// two 2-element child pairs the same way and writes their sum.
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/upsample.h"

namespace zp::kernels::cuda {
namespace {

template <class T>
struct alignas(2 * sizeof(T)) Pair {
  T a, b;
};

// Thread i writes the pair (img, output row oh, columns 2w and 2w + 1).
template <class T>
__global__ void upsample2x_forward_kernel(T* y, const T* x, int64_t total, int64_t H, int64_t W) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t w = i % W, rest = i / W, oh = rest % (2 * H), img = rest / (2 * H);
    const T v = x[(img * H + oh / 2) * W + w];
    *reinterpret_cast<Pair<T>*>(y + ((img * 2 * H + oh) * 2 * W + 2 * w)) = Pair<T>{v, v};
  }
}

// Thread i = (img, h, w) of dx.
template <class T>
__global__ void upsample2x_backward_kernel(T* dx, const T* dy, int64_t total, int64_t H, int64_t W) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t w = i % W, rest = i / W, h = rest % H, img = rest / H;
    const T* top = dy + (img * 2 * H + 2 * h) * 2 * W + 2 * w;
    const Pair<T> p = *reinterpret_cast<const Pair<T>*>(top);
    const Pair<T> q = *reinterpret_cast<const Pair<T>*>(top + 2 * W);
    dx[i] = from_f<T>(to_f(p.a) + to_f(p.b) + to_f(q.a) + to_f(q.b));
  }
}

unsigned grid_for(int64_t work) {
  int64_t blocks = (work + 255) / 256;
  return unsigned(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

}  // namespace

void upsample_nearest2x_forward(StreamHandle s, DType dt, void* y, const void* x, int64_t N, int64_t C, int64_t H,
                                int64_t W) {
  ZP_CHECK(N >= 0 && C >= 0 && H >= 0 && W >= 0, "N=", N, " C=", C, " H=", H, " W=", W);
  const int64_t pairs = N * C * 2 * H * W;
  if (pairs == 0) return;
  ZP_CHECK(reinterpret_cast<uintptr_t>(y) % (2 * dtype_size(dt)) == 0, "y must be aligned to two elements");
  ZP_CUDA_DISPATCH_FLOAT(dt, E, [&] {
    upsample2x_forward_kernel<<<grid_for(pairs), 256, 0, s>>>(static_cast<E*>(y), static_cast<const E*>(x), pairs,
                                                              H, W);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

void upsample_nearest2x_backward(StreamHandle s, DType dt, void* dx, const void* dy, int64_t N, int64_t C, int64_t H,
                                 int64_t W) {
  ZP_CHECK(N >= 0 && C >= 0 && H >= 0 && W >= 0, "N=", N, " C=", C, " H=", H, " W=", W);
  const int64_t total = N * C * H * W;
  if (total == 0) return;
  ZP_CHECK(reinterpret_cast<uintptr_t>(dy) % (2 * dtype_size(dt)) == 0, "dy must be aligned to two elements");
  ZP_CUDA_DISPATCH_FLOAT(dt, E, [&] {
    upsample2x_backward_kernel<<<grid_for(total), 256, 0, s>>>(static_cast<E*>(dx), static_cast<const E*>(dy),
                                                               total, H, W);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace zp::kernels::cuda
