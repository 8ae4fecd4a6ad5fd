// GroupNorm (+ optional SiLU) for NCHW, fp32 statistics whatever the storage type.
// The trick: in NCHW a group (n, g) is one contiguous span of C/G * HW elements, so the statistics
// are a plain block reduction over a span, one block per (n, g) (two passes: mean, then centred
// variance, the second served mostly from L2). The affine + SiLU is then a flat elementwise kernel
// over all elements, which keeps the whole GPU busy even when N * G is small.
// Backward: one block per (n, g) walks the group channel by channel; each channel's sums of dz and
// dz * xhat over HW are block-reduced once and give both that channel's dweight/dbias contribution
// (one atomicAdd per channel per block) and, weighted by weight[c], the group sums that dx needs.
// Loads are 16-byte packs when HW and the pointers allow it (a pack never straddles two channels).
// On sm_90 and later, large groups instead take one kernel whose thread-block cluster of 8 blocks
// shares a group: each block takes an eighth of the group's span, and the group's sums meet through
// distributed shared memory (cluster.map_shared_rank), so x (and dy) come from HBM once, the re-reads
// of a block's own slice hit L1/L2, and N * G * 8 blocks fill the GPU where N * G blocks did not.
// Measured on an H200 (zp_bench_kernels BM_GroupNormSiLU, 20 launches queued), it wins where a
// group is large (SDXL's 128x128: forward 46.9 -> 30.6 us, backward 83.3 -> 46.1) and, backward, where
// a group has many short channels (SD 1.5's 16x16: 76.6 -> 48.5, the per-group kernel's channel loop),
// and loses on SD 1.5's 64x64 and, forward, 32x32 (28.4 -> 37.8 and 15.7 -> 29.7 us: a cluster's fixed
// cost), so launch_forward and launch_backward choose by that (use_cluster).
// ZP_GROUPNORM_CLUSTER=0 never takes the cluster kernels and =1 always does where the device allows
// (to compare, test both paths, or rule one out).
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/groupnorm.h"

namespace zp::kernels::cuda {
namespace {

__device__ __forceinline__ float sigmoid(float z) { return 1.f / (1.f + expf(-z)); }

// The mean and the sum of squared deviations (M2) of packs [begin, end) of xg, in two passes (the
// second from L1/L2); every thread of the block calls it and receives both. An empty range gives 0, 0.
template <class T, int VEC>
__device__ __forceinline__ float2 block_mean_m2(const Pack<T, VEC>* xg, int64_t begin, int64_t end) {
  const float n = float((end - begin) * VEC);
  float sum = 0.f;
  for (int64_t p = begin + threadIdx.x; p < end; p += blockDim.x) {
    const Pack<T, VEC> xv = xg[p];
#pragma unroll
    for (int j = 0; j < VEC; ++j) sum += to_f(xv.v[j]);
  }
  const float m = n > 0 ? block_sum(sum) / n : 0.f;  // n is the same in the whole block
  float sq = 0.f;
  for (int64_t p = begin + threadIdx.x; p < end; p += blockDim.x) {
    const Pack<T, VEC> xv = xg[p];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float d = to_f(xv.v[j]) - m;
      sq += d * d;
    }
  }
  return make_float2(m, block_sum(sq));
}

// y of one pack of channel c: (x - mean) * rstd * weight + bias, through SiLU when asked.
template <class T, int VEC>
__device__ __forceinline__ Pack<T, VEC> normalize_pack(const Pack<T, VEC>& xv, float m, float r, float w, float b,
                                                       bool silu) {
  Pack<T, VEC> out;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float z = (to_f(xv.v[j]) - m) * r * w + b;
    out.v[j] = from_f<T>(silu ? z * sigmoid(z) : z);
  }
  return out;
}

template <class T, int VEC>
__global__ void groupnorm_stats_kernel(float* __restrict__ mean, float* __restrict__ rstd, const T* __restrict__ x,
                                       int64_t M, float eps) {
  const auto* xg = reinterpret_cast<const Pack<T, VEC>*>(x + int64_t(blockIdx.x) * M);
  const float2 mm2 = block_mean_m2(xg, 0, M / VEC);
  const float m = mm2.x, var = mm2.y / float(M);
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = m;
    rstd[blockIdx.x] = rsqrtf(var + eps);
  }
}

template <class T, int VEC>
__global__ void groupnorm_apply_kernel(T* __restrict__ y, const T* __restrict__ x, const float* __restrict__ mean,
                                       const float* __restrict__ rstd, const T* __restrict__ weight,
                                       const T* __restrict__ bias, int64_t total_packs, int64_t HW, int C, int Cg,
                                       bool silu) {
  using P = Pack<T, VEC>;
  const P* xp = reinterpret_cast<const P*>(x);
  P* yp = reinterpret_cast<P*>(y);
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < total_packs;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t nc = p * VEC / HW;  // n * C + c
    const int c = int(nc % C);
    const int64_t ng = nc / Cg;  // n * G + c / Cg
    const float m = mean[ng], r = rstd[ng], w = to_f(weight[c]), b = to_f(bias[c]);
    yp[p] = normalize_pack(xp[p], m, r, w, b, silu);
  }
}

// dL/dz from dL/dy: the pre-activation z is recomputed from the normalised value.
__device__ __forceinline__ float grad_pre_activation(float dy, float xhat, float w, float b, bool silu) {
  if (!silu) return dy;
  const float z = xhat * w + b, s = sigmoid(z);
  return dy * s * (1.f + z * (1.f - s));
}

// One channel's share of a group's backward over the group's packs [lo, hi) (xg, dyg: the group's
// first pack): its sums of dz and dz * xhat go to dbias[c] and dweight[c] (one atomicAdd each), and
// weighted by weight[c] into g (the group's sums). Every thread of the block calls it.
template <class T, int VEC>
__device__ __forceinline__ void reduce_channel(const Pack<T, VEC>* xg, const Pack<T, VEC>* dyg, int64_t lo,
                                               int64_t hi, int c, const T* weight, const T* bias, float m, float r,
                                               bool silu, float* dweight, float* dbias, float (&g)[2]) {
  const float w = to_f(weight[c]), b = to_f(bias[c]);
  float dz_sum = 0.f, dzx_sum = 0.f;
  for (int64_t p = lo + threadIdx.x; p < hi; p += blockDim.x) {
    const Pack<T, VEC> xv = xg[p], dv = dyg[p];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float xhat = (to_f(xv.v[j]) - m) * r;
      const float dz = grad_pre_activation(to_f(dv.v[j]), xhat, w, b, silu);
      dz_sum += dz;
      dzx_sum += dz * xhat;
    }
  }
  dz_sum = block_sum(dz_sum);
  dzx_sum = block_sum(dzx_sum);
  if (threadIdx.x == 0) {
    atomicAdd(dbias + c, dz_sum);
    atomicAdd(dweight + c, dzx_sum);
  }
  g[0] += w * dz_sum;
  g[1] += w * dzx_sum;
}

// dx of one pack of channel c, from the group's means of weight * dz and weight * dz * xhat.
template <class T, int VEC>
__device__ __forceinline__ Pack<T, VEC> input_grad(const Pack<T, VEC>& xv, const Pack<T, VEC>& dv, int c,
                                                   const T* weight, const T* bias, float m, float r, float g_mean,
                                                   float gx_mean, bool silu) {
  const float w = to_f(weight[c]), b = to_f(bias[c]);
  Pack<T, VEC> out;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float xhat = (to_f(xv.v[j]) - m) * r;
    const float dz = grad_pre_activation(to_f(dv.v[j]), xhat, w, b, silu);
    out.v[j] = from_f<T>(r * (dz * w - g_mean - xhat * gx_mean));
  }
  return out;
}

template <class T, int VEC>
__global__ void groupnorm_backward_kernel(T* __restrict__ dx, float* __restrict__ dweight, float* __restrict__ dbias,
                                          const T* __restrict__ dy, const T* __restrict__ x,
                                          const T* __restrict__ weight, const T* __restrict__ bias,
                                          const float* __restrict__ mean, const float* __restrict__ rstd, int G,
                                          int Cg, int64_t HW, bool silu) {
  using P = Pack<T, VEC>;
  const int64_t ng = blockIdx.x;
  const int c0 = int(ng % G) * Cg;
  const int64_t PC = HW / VEC;  // packs per channel
  const P* xg = reinterpret_cast<const P*>(x + ng * Cg * HW);
  const P* dyg = reinterpret_cast<const P*>(dy + ng * Cg * HW);
  const float m = mean[ng], r = rstd[ng];

  // Every thread receives each block_sum result, so all threads carry the same group sums.
  float g[2] = {0.f, 0.f};
  for (int ci = 0; ci < Cg; ++ci)
    reduce_channel(xg, dyg, ci * PC, (ci + 1) * PC, c0 + ci, weight, bias, m, r, silu, dweight, dbias, g);
  const float inv_m = 1.f / float(int64_t(Cg) * HW);
  const float g_mean = g[0] * inv_m, gx_mean = g[1] * inv_m;

  P* dxg = reinterpret_cast<P*>(dx + ng * Cg * HW);
  for (int ci = 0; ci < Cg; ++ci)
    for (int64_t p = ci * PC + threadIdx.x; p < (ci + 1) * PC; p += blockDim.x)
      dxg[p] = input_grad(xg[p], dyg[p], c0 + ci, weight, bias, m, r, g_mean, gx_mean, silu);
}

// --- sm_90: one cluster of kClusterBlocks blocks per group.
constexpr int kClusterBlocks = 8;  // the portable cluster size
constexpr int kClusterThreads = 256;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define ZP_GROUPNORM_CLUSTER_CODE 1
namespace cg = cooperative_groups;

// v[k] summed over the cluster's blocks, in block-rank order (the same sum in every block). `slot`
// is the block's shared [K]; the second barrier keeps it from being rewritten, or the block from
// leaving, while another block still reads it.
template <int K>
__device__ __forceinline__ void cluster_sums(cg::cluster_group& cluster, float (&v)[K], float* slot) {
  if (threadIdx.x == 0)
    for (int k = 0; k < K; ++k) slot[k] = v[k];
  cluster.sync();
  float t[K] = {};
  for (unsigned r = 0; r < cluster.num_blocks(); ++r) {
    const float* remote = cluster.map_shared_rank(slot, r);
    for (int k = 0; k < K; ++k) t[k] += remote[k];
  }
  cluster.sync();
  for (int k = 0; k < K; ++k) v[k] = t[k];
}
#endif

// The packs [begin, end) of its group that this block of the cluster takes.
struct ClusterSlice {
  int64_t begin, end;
  __device__ ClusterSlice(int64_t packs, int rank) {
    const int64_t per = (packs + kClusterBlocks - 1) / kClusterBlocks;
    begin = min(packs, rank * per);
    end = min(packs, begin + per);
  }
};

template <class T, int VEC>
__global__ void __launch_bounds__(kClusterThreads)
    groupnorm_forward_cluster_kernel(T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd,
                                     const T* __restrict__ x, const T* __restrict__ weight,
                                     const T* __restrict__ bias, int G, int Cg, int64_t HW, float eps, bool silu) {
#ifdef ZP_GROUPNORM_CLUSTER_CODE
  using P = Pack<T, VEC>;
  __shared__ float slot[3];
  cg::cluster_group cluster = cg::this_cluster();
  const int64_t ng = blockIdx.x / kClusterBlocks, PC = HW / VEC;
  const ClusterSlice sl(Cg * PC, int(cluster.block_rank()));
  const P* xg = reinterpret_cast<const P*>(x + ng * Cg * HW);
  // The block's own slice in two passes (mean, then centred squares; the second from L1), then
  // Chan's combination of the blocks' (count, mean, M2) in rank order: one exchange per group, with
  // the robustness of two passes over the whole group.
  const float n_b = float((sl.end - sl.begin) * VEC);
  const float2 mm2 = block_mean_m2(xg, sl.begin, sl.end);
  float part[3] = {n_b, mm2.x, mm2.y};
  if (threadIdx.x == 0)
    for (int k = 0; k < 3; ++k) slot[k] = part[k];
  cluster.sync();
  float n = 0.f, m = 0.f, m2 = 0.f;
  for (unsigned q = 0; q < cluster.num_blocks(); ++q) {
    const float* o = cluster.map_shared_rank(slot, q);
    if (o[0] == 0.f) continue;
    const float n_ab = n + o[0], delta = o[1] - m;
    m += delta * (o[0] / n_ab);
    m2 += o[2] + delta * delta * (n * o[0] / n_ab);
    n = n_ab;
  }
  cluster.sync();  // no block leaves while another reads its slot
  const float r = rsqrtf(m2 / n + eps);
  if (cluster.block_rank() == 0 && threadIdx.x == 0) {
    mean[ng] = m;
    rstd[ng] = r;
  }
  const int c0 = int(ng % G) * Cg;
  P* yg = reinterpret_cast<P*>(y + ng * Cg * HW);
  for (int64_t p = sl.begin + threadIdx.x; p < sl.end; p += blockDim.x) {
    const int c = c0 + int(p / PC);
    yg[p] = normalize_pack(xg[p], m, r, to_f(weight[c]), to_f(bias[c]), silu);
  }
#else
  __trap();  // launched only where the device and this binary have sm_90 code (cluster_kernels_usable)
#endif
}

// The backward over one group's cluster: each block reduces its slice channel by channel (the
// channel's dweight/dbias share goes out by one atomicAdd), the group sums meet across the cluster,
// and the block writes dx over its slice.
template <class T, int VEC>
__global__ void __launch_bounds__(kClusterThreads)
    groupnorm_backward_cluster_kernel(T* __restrict__ dx, float* __restrict__ dweight, float* __restrict__ dbias,
                                      const T* __restrict__ dy, const T* __restrict__ x,
                                      const T* __restrict__ weight, const T* __restrict__ bias,
                                      const float* __restrict__ mean, const float* __restrict__ rstd, int G, int Cg,
                                      int64_t HW, bool silu) {
#ifdef ZP_GROUPNORM_CLUSTER_CODE
  using P = Pack<T, VEC>;
  __shared__ float slot[2];
  cg::cluster_group cluster = cg::this_cluster();
  const int64_t ng = blockIdx.x / kClusterBlocks, PC = HW / VEC;
  const ClusterSlice sl(Cg * PC, int(cluster.block_rank()));
  const int c0 = int(ng % G) * Cg;
  const int64_t base = ng * Cg * HW;
  const P* xg = reinterpret_cast<const P*>(x + base);
  const P* dyg = reinterpret_cast<const P*>(dy + base);
  const float m = mean[ng], r = rstd[ng];
  float g[2] = {0.f, 0.f};  // sums of weight * dz and weight * dz * xhat over the slice
  if (sl.begin < sl.end)      // the same in the whole block, so reduce_channel's block_sums are safe
    for (int64_t ci = sl.begin / PC; ci <= (sl.end - 1) / PC; ++ci)
      reduce_channel(xg, dyg, max(sl.begin, ci * PC), min(sl.end, (ci + 1) * PC), c0 + int(ci), weight, bias, m, r,
                     silu, dweight, dbias, g);
  cluster_sums(cluster, g, slot);
  const float inv_m = 1.f / float(int64_t(Cg) * HW);
  const float g_mean = g[0] * inv_m, gx_mean = g[1] * inv_m;
  P* dxg = reinterpret_cast<P*>(dx + base);
  for (int64_t p = sl.begin + threadIdx.x; p < sl.end; p += blockDim.x)
    dxg[p] = input_grad(xg[p], dyg[p], c0 + int(p / PC), weight, bias, m, r, g_mean, gx_mean, silu);
#else
  __trap();
#endif
}

constexpr int kApplyThreads = 256;
constexpr int kMaxBlockThreads = 512;

// Threads for a block that reduces `packs` packs: a multiple of 32, no more than there is work for.
int block_threads(int64_t packs) {
  return int(std::clamp<int64_t>((packs + 31) / 32 * 32, 32, kMaxBlockThreads));
}

// Whether the cluster kernels can run here: a device of compute capability 9 or later and a binary
// with sm_90 code for them (asked once: every kernel of this file is built for the same
// architectures).
template <class Kernel>
bool cluster_kernels_usable(Kernel kernel) {
  if (device_compute_major() < 9) return false;
  static const bool built_for_sm90 = [&] {
    cudaFuncAttributes attr{};
    ZP_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    return attr.binaryVersion >= 90;
  }();
  return built_for_sm90;
}

// Groups of at least this many elements take the cluster kernels (the top of this file).
constexpr int64_t kClusterMinGroup = 65536;
// Backward: channels this short or shorter take them too.
constexpr int64_t kClusterMaxChannelBackward = 256;

// Whether this call takes `kernel`, a cluster kernel: `by_shape` unless ZP_GROUPNORM_CLUSTER is "0"
// (never) or "1" (always), read on each call so that a test can run both paths.
template <class Kernel>
bool use_cluster(Kernel kernel, bool by_shape) {
  const char* v = std::getenv("ZP_GROUPNORM_CLUSTER");
  const bool forced = v && (std::strcmp(v, "0") == 0 || std::strcmp(v, "1") == 0);
  if (forced ? v[0] == '0' : !by_shape) return false;
  return cluster_kernels_usable(kernel);
}

// One cluster of kClusterBlocks blocks per group.
template <class... Params, class... Args>
void launch_clusters(void (*kernel)(Params...), int64_t groups, cudaStream_t s, Args&&... args) {
  ZP_CHECK(groups * kClusterBlocks <= std::numeric_limits<int32_t>::max(), "groupnorm: ", groups, " groups");
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kClusterBlocks;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(groups * kClusterBlocks));
  cfg.blockDim = dim3(kClusterThreads);
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  ZP_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

template <class T, int VEC>
void launch_forward(StreamHandle s, T* y, float* mean, float* rstd, const T* x, const T* w, const T* b, int64_t N,
                    int64_t C, int64_t HW, int64_t G, float eps, bool silu) {
  if (use_cluster(groupnorm_forward_cluster_kernel<T, VEC>, C / G * HW >= kClusterMinGroup)) {
    launch_clusters(groupnorm_forward_cluster_kernel<T, VEC>, N * G, s, y, mean, rstd, x, w, b, int(G), int(C / G),
                    HW, eps, silu);
    return;
  }
  const int64_t Cg = C / G, M = Cg * HW;
  groupnorm_stats_kernel<T, VEC><<<unsigned(N * G), block_threads(M / VEC), 0, s>>>(mean, rstd, x, M, eps);
  const int64_t total_packs = N * C * HW / VEC;
  const int64_t grid = std::min<int64_t>((total_packs + kApplyThreads - 1) / kApplyThreads, 65535 * 8);
  groupnorm_apply_kernel<T, VEC><<<unsigned(grid), kApplyThreads, 0, s>>>(y, x, mean, rstd, w, b, total_packs, HW,
                                                                          int(C), int(Cg), silu);
}

template <class T, int VEC>
void launch_backward(StreamHandle s, T* dx, float* dw, float* db, const T* dy, const T* x, const T* w, const T* b,
                     const float* mean, const float* rstd, int64_t N, int64_t C, int64_t HW, int64_t G, bool silu) {
  if (use_cluster(groupnorm_backward_cluster_kernel<T, VEC>,
                  C / G * HW >= kClusterMinGroup || HW <= kClusterMaxChannelBackward)) {
    launch_clusters(groupnorm_backward_cluster_kernel<T, VEC>, N * G, s, dx, dw, db, dy, x, w, b, mean, rstd, int(G),
                    int(C / G), HW, silu);
    return;
  }
  groupnorm_backward_kernel<T, VEC><<<unsigned(N * G), block_threads(HW / VEC), 0, s>>>(
      dx, dw, db, dy, x, w, b, mean, rstd, int(G), int(C / G), HW, silu);
}

void check_sizes(int64_t N, int64_t C, int64_t HW, int64_t G) {
  ZP_CHECK(N >= 0 && C > 0 && HW > 0 && G > 0 && C % G == 0, "N=", N, " C=", C, " HW=", HW, " G=", G);
  ZP_CHECK(C <= std::numeric_limits<int32_t>::max() && N * G <= std::numeric_limits<int32_t>::max(), "N=", N,
           " C=", C, " G=", G);
}

}  // namespace

void groupnorm_forward(StreamHandle s, DType dt, void* y, float* mean, float* rstd, const void* x, const void* weight,
                       const void* bias, int64_t N, int64_t C, int64_t HW, int64_t G, float eps, bool silu) {
  check_sizes(N, C, HW, G);
  ZP_CHECK(mean && rstd && weight && bias);
  if (N == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    auto* py = static_cast<T*>(y);
    auto* px = static_cast<const T*>(x);
    auto* w = static_cast<const T*>(weight);
    auto* b = static_cast<const T*>(bias);
    if (can_vectorise<T>(HW, {y, x}))
      launch_forward<T, 16 / sizeof(T)>(s, py, mean, rstd, px, w, b, N, C, HW, G, eps, silu);
    else
      launch_forward<T, 1>(s, py, mean, rstd, px, w, b, N, C, HW, G, eps, silu);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

void groupnorm_backward(StreamHandle s, DType dt, void* dx, float* dweight, float* dbias, const void* dy, const void* x,
                        const void* weight, const void* bias, const float* mean, const float* rstd, int64_t N,
                        int64_t C, int64_t HW, int64_t G, bool silu) {
  check_sizes(N, C, HW, G);
  ZP_CHECK(dweight && dbias && weight && bias && mean && rstd);
  if (N == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    auto* pdx = static_cast<T*>(dx);
    auto* pdy = static_cast<const T*>(dy);
    auto* px = static_cast<const T*>(x);
    auto* w = static_cast<const T*>(weight);
    auto* b = static_cast<const T*>(bias);
    if (can_vectorise<T>(HW, {dx, dy, x}))
      launch_backward<T, 16 / sizeof(T)>(s, pdx, dweight, dbias, pdy, px, w, b, mean, rstd, N, C, HW, G, silu);
    else
      launch_backward<T, 1>(s, pdx, dweight, dbias, pdy, px, w, b, mean, rstd, N, C, HW, G, silu);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace zp::kernels::cuda
