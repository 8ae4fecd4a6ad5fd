// Weighted MSE. The forward gives each sample one block that walks its n elements and reduces in a
// fixed order: diffusion batches are a handful of samples of at most ~65K latent elements, so one
// pass of B blocks takes microseconds, stays deterministic and needs no scratch buffer. The backward
// is a grid-stride elementwise kernel over all B * n elements.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/mse.h"

namespace zp::kernels::cuda {
namespace {

constexpr int kThreads = 512;

template <class T>
__global__ void __launch_bounds__(kThreads) mse_forward_kernel(float* losses, const T* pred, const float* target,
                                                               const float* weight, int64_t n) {
  const int64_t b = blockIdx.x;
  const T* p = pred + b * n;
  const float* t = target + b * n;
  float acc = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const float d = to_f(p[i]) - t[i];
    acc += d * d;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) losses[b] = (weight ? weight[b] : 1.f) * acc / float(n);
}

template <class T>
__global__ void mse_backward_kernel(T* dpred, const T* pred, const float* target, const float* weight, float c,
                                    int64_t n, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const float w = weight ? weight[i / n] : 1.f;
    dpred[i] = from_f<T>(c * w * (to_f(pred[i]) - target[i]));
  }
}

}  // namespace

void mse_forward(StreamHandle s, DType dt, float* losses, const void* pred, const float* target, const float* weight,
                 int64_t B, int64_t n) {
  ZP_CHECK(B >= 0 && n > 0, "mse_forward B=", B, " n=", n);
  ZP_CHECK(B < (int64_t(1) << 31), "mse_forward: ", B, " samples");
  if (B == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    mse_forward_kernel<<<unsigned(B), kThreads, 0, s>>>(losses, static_cast<const T*>(pred), target, weight, n);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

void mse_backward(StreamHandle s, DType dt, void* dpred, const void* pred, const float* target, const float* weight,
                  float scale, int64_t B, int64_t n) {
  ZP_CHECK(B >= 0 && n > 0, "mse_backward B=", B, " n=", n);
  const int64_t total = B * n;
  if (total == 0) return;
  const float c = float(2.0 * double(scale) / (double(B) * double(n)));
  const long long blocks = (total + 255) / 256;
  const unsigned grid = unsigned(blocks < 65535 * 8 ? blocks : 65535 * 8);
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    mse_backward_kernel<<<grid, 256, 0, s>>>(static_cast<T*>(dpred), static_cast<const T*>(pred), target, weight, c,
                                             n, total);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace zp::kernels::cuda
