// Nearest 2x upsampling of channels-last images. Forward: one thread per pack of VEC channels of an
// output pixel, read from its parent pixel; backward: one thread per pack of an input pixel, the sum of
// its four children's packs. A pixel's channels are contiguous, so packs (16 bytes where C and the
// pointers allow) never straddle pixels and both directions read and write whole rows.
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/upsample.h"

namespace zp::kernels::cuda {
namespace {

// Thread i writes pack i of y[N, 2H, 2W, C] (CP packs a pixel).
template <class T, int VEC>
__global__ void upsample2x_forward_kernel(T* y, const T* x, int64_t total, int64_t H, int64_t W, int64_t CP) {
  using P = Pack<T, VEC>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t cp = i % CP, pixel = i / CP, ow = pixel % (2 * W), rest = pixel / (2 * W), oh = rest % (2 * H),
                  n = rest / (2 * H);
    reinterpret_cast<P*>(y)[i] = reinterpret_cast<const P*>(x)[((n * H + oh / 2) * W + ow / 2) * CP + cp];
  }
}

// Thread i writes pack i of dx[N, H, W, C].
template <class T, int VEC>
__global__ void upsample2x_backward_kernel(T* dx, const T* dy, int64_t total, int64_t H, int64_t W, int64_t CP) {
  using P = Pack<T, VEC>;
  const P* g = reinterpret_cast<const P*>(dy);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t cp = i % CP, pixel = i / CP, w = pixel % W, rest = pixel / W, h = rest % H, n = rest / H;
    const int64_t c00 = ((n * 2 * H + 2 * h) * 2 * W + 2 * w) * CP + cp, c10 = c00 + 2 * W * CP;
    const P a = g[c00], b = g[c00 + CP], c = g[c10], d = g[c10 + CP];
    P out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) out.v[j] = from_f<T>(to_f(a.v[j]) + to_f(b.v[j]) + to_f(c.v[j]) + to_f(d.v[j]));
    reinterpret_cast<P*>(dx)[i] = out;
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
  const int64_t total = N * C * 4 * H * W;
  if (total == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, E, [&] {
    E* py = static_cast<E*>(y);
    const E* px = static_cast<const E*>(x);
    with_pack_width<E>(C, {py, px}, [&](auto vec) {
      constexpr int VEC = decltype(vec)::value;
      upsample2x_forward_kernel<E, VEC><<<grid_for(total / VEC), 256, 0, s>>>(py, px, total / VEC, H, W, C / VEC);
    });
  });
  ZP_CUDA_LAUNCH_CHECK();
}

void upsample_nearest2x_backward(StreamHandle s, DType dt, void* dx, const void* dy, int64_t N, int64_t C, int64_t H,
                                 int64_t W) {
  ZP_CHECK(N >= 0 && C >= 0 && H >= 0 && W >= 0, "N=", N, " C=", C, " H=", H, " W=", W);
  const int64_t total = N * C * H * W;
  if (total == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, E, [&] {
    E* pdx = static_cast<E*>(dx);
    const E* pdy = static_cast<const E*>(dy);
    with_pack_width<E>(C, {pdx, pdy}, [&](auto vec) {
      constexpr int VEC = decltype(vec)::value;
      upsample2x_backward_kernel<E, VEC><<<grid_for(total / VEC), 256, 0, s>>>(pdx, pdy, total / VEC, H, W, C / VEC);
    });
  });
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace zp::kernels::cuda
