// Embedding lookup and its gradient. The table gradient scatters rows of dy into dtable with fp32
// atomicAdd, one thread per element: simple and fast when tokens rarely repeat within a batch, but
// the order of the additions (and so the last bits of dtable) varies from run to run. The positional
// gradient instead gives each (position, channel) to one thread that walks the rows of that position,
// so it needs no atomics and is deterministic.
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/embedding.h"

namespace zp::kernels::cuda {
namespace {

template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// One thread per V consecutive channels of one row (C % V == 0).
template <int V, class T>
__global__ void embedding_forward_kernel(T* y, const int32_t* ids, const T* table, const T* pos_table,
                                         int64_t N, int64_t C, int64_t T_, int64_t pos_offset,
                                         const int32_t* positions) {
  pdl_launch_dependents();  // the next kernel of a decode step may start (cuda_common.cuh)
  const int64_t packs_per_row = C / V;
  const int64_t total = N * packs_per_row;
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < total; p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = p / packs_per_row, c = (p - r * packs_per_row) * V;
    Pack<T, V> tok = *reinterpret_cast<const Pack<T, V>*>(table + int64_t(ids[r]) * C + c);
    if (pos_table) {
      const int64_t at = positions ? int64_t(positions[r]) : pos_offset + r % T_;
      Pack<T, V> pos = *reinterpret_cast<const Pack<T, V>*>(pos_table + at * C + c);
#pragma unroll
      for (int j = 0; j < V; ++j) tok.v[j] = from_f<T>(to_f(tok.v[j]) + to_f(pos.v[j]));
    }
    *reinterpret_cast<Pack<T, V>*>(y + r * C + c) = tok;
  }
}

template <class T>
__global__ void embedding_table_backward_kernel(float* dtable, const T* dy, const int32_t* ids, int64_t N, int64_t C) {
  const int64_t total = N * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / C, c = i - r * C;
    atomicAdd(dtable + int64_t(ids[r]) * C + c, to_f(dy[i]));
  }
}

// Given positions: one thread per element, added into its row's position with an atomic.
template <class T>
__global__ void embedding_pos_scatter_kernel(float* dpos_table, const T* dy, const int32_t* positions, int64_t N,
                                             int64_t C) {
  const int64_t total = N * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / C, c = i - r * C;
    atomicAdd(dpos_table + int64_t(positions[r]) * C + c, to_f(dy[i]));
  }
}

// Thread (t, c) sums dy[t, c], dy[t + T, c], ... : rows of position pos_offset + t.
template <class T>
__global__ void embedding_pos_backward_kernel(float* dpos_table, const T* dy, int64_t N, int64_t C, int64_t T_,
                                              int64_t pos_offset) {
  const int64_t total = (T_ < N ? T_ : N) * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / C, c = i - t * C;
    float sum = 0.f;
    for (int64_t r = t; r < N; r += T_) sum += to_f(dy[r * C + c]);
    dpos_table[(pos_offset + t) * C + c] += sum;
  }
}

unsigned grid_for(int64_t work) {
  int64_t blocks = (work + 255) / 256;
  return unsigned(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void embedding_forward(StreamHandle s, DType dt, void* y, const int32_t* ids, const void* table, int64_t N,
                       int64_t C, int64_t V, const void* pos_table, int64_t T, int64_t pos_offset,
                       const int32_t* positions) {
  ZP_CHECK(N >= 0 && C >= 0 && V > 0, "N=", N, " C=", C, " V=", V);
  if (pos_table) ZP_CHECK(T > 0 && pos_offset >= 0, "T=", T, " pos_offset=", pos_offset);
  if (N == 0 || C == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, E, [&] {
    constexpr int kVec = 16 / sizeof(E);
    auto* py = static_cast<E*>(y);
    auto* pt = static_cast<const E*>(table);
    auto* pp = static_cast<const E*>(pos_table);
    const bool vec = C % kVec == 0 && aligned16(py) && aligned16(pt) && (!pp || aligned16(pp));
    if (vec)
      embedding_forward_kernel<kVec><<<grid_for(N * C / kVec), 256, 0, s>>>(py, ids, pt, pp, N, C, T, pos_offset,
                                                                                  positions);
    else
      embedding_forward_kernel<1><<<grid_for(N * C), 256, 0, s>>>(py, ids, pt, pp, N, C, T, pos_offset, positions);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

void embedding_backward(StreamHandle s, DType dt, float* dtable, float* dpos_table, const void* dy,
                        const int32_t* ids, int64_t N, int64_t C, int64_t V, int64_t T, int64_t pos_offset,
                        const int32_t* positions) {
  ZP_CHECK(N >= 0 && C >= 0 && V > 0, "N=", N, " C=", C, " V=", V);
  if (dpos_table) ZP_CHECK(T > 0 && pos_offset >= 0, "T=", T, " pos_offset=", pos_offset);
  if (N == 0 || C == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, E, [&] {
    auto* pdy = static_cast<const E*>(dy);
    embedding_table_backward_kernel<<<grid_for(N * C), 256, 0, s>>>(dtable, pdy, ids, N, C);
    ZP_CUDA_LAUNCH_CHECK();
    if (dpos_table && positions) {
      embedding_pos_scatter_kernel<<<grid_for(N * C), 256, 0, s>>>(dpos_table, pdy, positions, N, C);
      ZP_CUDA_LAUNCH_CHECK();
    } else if (dpos_table) {
      embedding_pos_backward_kernel<<<grid_for((T < N ? T : N) * C), 256, 0, s>>>(dpos_table, pdy, N, C, T,
                                                                                  pos_offset);
      ZP_CUDA_LAUNCH_CHECK();
    }
  });
}

}  // namespace zp::kernels::cuda
