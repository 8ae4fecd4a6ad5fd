// Multi-tensor sum of squares, deterministic: every block squares-and-sums one fixed chunk of one
// tensor into its own slot of a partials array, then a single block adds the partials in a fixed
// order in double. No atomics, so the result is bitwise reproducible run to run. Tensor lists travel
// as __grid_constant__ kernel parameters in batches (no table upload, no host synchronisation).
#include <algorithm>
#include <climits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/scratch.cuh"
#include "kernels/reduce.h"

namespace zp::kernels::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int64_t kChunk = 16384;  // elements per block: 32 per thread
constexpr int kMaxTensors = 96;    // keeps the parameter struct under the classic 4 KB limit

struct Batch {
  const void* ptr[kMaxTensors];
  int64_t n[kMaxTensors];
  int64_t first_chunk[kMaxTensors];  // block index where each tensor's chunks start
  int count;
};

template <class T>
__global__ void __launch_bounds__(kThreads) sum_squares_chunks_kernel(float* partials, const __grid_constant__ Batch b) {
  const int64_t block = blockIdx.x;
  int lo = 0, hi = b.count - 1;  // the last tensor whose first chunk is <= this block
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (b.first_chunk[mid] <= block) lo = mid;
    else hi = mid - 1;
  }
  const int64_t start = (block - b.first_chunk[lo]) * kChunk;
  const int64_t len = min(kChunk, b.n[lo] - start);
  const T* x = static_cast<const T*>(b.ptr[lo]) + start;
  float acc = 0.f;
  for (int64_t i = threadIdx.x; i < len; i += kThreads) {
    float v = to_f(x[i]);
    acc += v * v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[block] = acc;
}

__global__ void __launch_bounds__(1024) sum_partials_kernel(float* out, const float* partials, int64_t count) {
  double acc = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += double(partials[i]);
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  __shared__ double warp_sums[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < int(blockDim.x >> 5) ? warp_sums[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) *out = float(acc);
  }
}

}  // namespace

void l2norm_squared(StreamHandle s, DType dt, float* out, const void* const* ptrs, const int64_t* sizes, int count) {
  ZP_CHECK(count >= 0);
  int64_t total_chunks = 0;
  for (int t = 0; t < count; ++t) {
    ZP_CHECK(sizes[t] >= 0);
    total_chunks += (sizes[t] + kChunk - 1) / kChunk;
  }
  KernelScratch scratch(s, size_t(std::max<int64_t>(total_chunks, 1)) * sizeof(float), "reduce_scratch");
  float* partials = scratch.as<float>();

  int64_t done_chunks = 0;  // partials slot of the current batch's first chunk
  Batch b{};
  int64_t batch_chunks = 0;
  auto flush = [&] {
    if (b.count == 0) return;
    ZP_CHECK(batch_chunks < INT_MAX);
    ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
      sum_squares_chunks_kernel<T><<<unsigned(batch_chunks), kThreads, 0, s>>>(partials + done_chunks, b);
    });
    ZP_CUDA_LAUNCH_CHECK();
    done_chunks += batch_chunks;
    b.count = 0;
    batch_chunks = 0;
  };
  for (int t = 0; t < count; ++t) {
    if (sizes[t] == 0) continue;
    const int64_t chunks = (sizes[t] + kChunk - 1) / kChunk;
    if (b.count == kMaxTensors || batch_chunks + chunks >= INT_MAX) flush();
    b.ptr[b.count] = ptrs[t];
    b.n[b.count] = sizes[t];
    b.first_chunk[b.count] = batch_chunks;
    ++b.count;
    batch_chunks += chunks;
  }
  flush();
  sum_partials_kernel<<<1, 1024, 0, s>>>(out, partials, total_chunks);
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace zp::kernels::cuda
