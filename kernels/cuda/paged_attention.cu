// Paged attention on the GPU (flash-decoding).
//
// kv_cache_write is a scatter: one thread per 16-byte pack of a token's row (per element when the rows
// or pointers do not allow packs), sent to slot * Hkv * D.
//
// paged_attention_forward: one thread block per (query row, kv head, slice of NH of the query heads
// that read it, partition of the keys). The heads of a slice are handled together, so a block reads
// each key and value row once for all of them. NH is the GQA group size (up to 8; larger groups take
// ceil(group / 8) blocks), or less when the grid would leave SMs idle (see the launcher). Decoding is bound by reading the cache, so the work is laid
// out for wide independent loads rather than for arithmetic:
//  - Each warp owns 32 consecutive keys at a time and keeps its own online softmax (no barrier inside
//    the key loop). Scores: lane = key; each lane reads its whole key row in 16-byte packs (its slot
//    from the block table) and dots it with the 8 query rows, which sit pre-scaled by scale*log2(e)
//    in shared memory and are read as float4 broadcasts. Values: lane = a slice of DP/32 consecutive
//    head dims, so one value row is one coalesced warp load; a key's slot comes from its lane by a
//    shuffle and the 32 probabilities go through a small per-warp shared buffer.
//  - Decoding one sequence is a chain of dependent loads, each a trip to HBM, so the chain is kept
//    short: the query rows load with the sequence lookup, the first block-table entries across the
//    barrier that publishes the queries, and the value rows (whose addresses need only the slots)
//    with the key rows, before the scores exist. At batch 1 the kernel took 20 us for 256 keys on an
//    H200 when each of these waited for the one before.
//  - At the end the 4 warps' (max, sum, acc) are merged in shared memory.
// When (rows x kv heads x head slices) alone cannot fill the SMs, the context is cut into partitions
// (at least 128 keys, sized for about two blocks per SM); each block then writes its normalised partial
// output and (max, sum) to KernelScratch and a second kernel combines the partitions. A batch that fills
// the GPU runs one partition: the first kernel writes the output directly.
// Every query row is independent (its sequence found by a binary search over query_starts and its own
// visible length), so prefill chunks run correctly too, just without tuning.
// Few rows (a decode step of a handful of sequences) take paged_decode_kernel instead: a block per
// query head and a short partition of the keys, the partitions merged by the last block to finish.
// A batch of 16-bit rows with 64 or 128 head dims and groups of up to 16 heads takes
// paged_gqa_mma_kernel, the same layout on tensor cores (its comment); the FMA kernel above keeps the
// rest (fp32, other head dims, larger groups, unaligned rows).
#include <algorithm>
#include <bit>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/scratch.cuh"
#include "kernels/paged_attention.h"

namespace zp::kernels::cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// kv_cache_write

template <class T, int VEC>
__global__ void kv_cache_write_kernel(T* kc, T* vc, const T* k, const T* v, int64_t N, int64_t W, int64_t ks,
                                      int64_t vs, const int32_t* slots) {
  pdl_launch_dependents();  // the next kernel of a decode step may start (cuda_common.cuh)
  pdl_wait();               // launched as a dependent of the kernel ahead (launch_dependent)
  using P = Pack<T, VEC>;
  const int64_t packs = W / VEC;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * packs;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / packs, c = (i % packs) * VEC;
    const int32_t slot = slots[n];
    if (slot < 0) continue;
    *reinterpret_cast<P*>(kc + int64_t(slot) * W + c) = *reinterpret_cast<const P*>(k + n * ks + c);
    *reinterpret_cast<P*>(vc + int64_t(slot) * W + c) = *reinterpret_cast<const P*>(v + n * vs + c);
  }
}

// ---------------------------------------------------------------------------------------------
// paged_attention_forward

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxHeads = 8;   // query heads per block, at most
constexpr int kChunk = 32;     // keys per warp step (lane = key)
constexpr int kMinPart = 128;  // keys per partition, at least, when the context is split
constexpr float kLog2e = 1.4426950408889634f;
constexpr int64_t kMaxDoneCounters = 16384;

struct PagedParams {
  const int32_t* block_tables;
  const int32_t* context_lens;
  const int32_t* query_starts;
  int64_t max_blocks, qs, os;
  int num_seqs, Hq, Hkv, D, group, head_slices, log2_bs;
  float scale_log2;  // scale * log2(e): scores in base 2 for exp2f
  int part_len, parts;
  bool packed;       // cache rows are 16-byte packs (D * sizeof(T) % 16 == 0, aligned caches)
  float* part_o;     // [num_tokens, Hq, parts, D], normalised per partition (parts > 1 only)
  float2* part_ml;   // [num_tokens, Hq, parts]: (max in base 2, sum of exp2)
  unsigned* done;    // few-rows kernel, parts > 1: [num_tokens * Hq] partitions finished, left at 0
};

// f[e] = row[d0 + e] for e < VE (0 past D). `packed`: the row is 16-byte aligned and D == VE * 32.
template <class T, int VE>
__device__ __forceinline__ void load_slice(float (&f)[VE], const T* row, int d0, int D, bool packed) {
  constexpr bool pow2 = (VE & (VE - 1)) == 0;
  constexpr int LV = !pow2 ? 1 : (VE * int(sizeof(T)) <= 16 ? VE : 16 / int(sizeof(T)));
  if constexpr (LV > 1) {
    if (packed) {
#pragma unroll
      for (int c = 0; c < VE; c += LV) {
        Pack<T, LV> pk = *reinterpret_cast<const Pack<T, LV>*>(row + d0 + c);
#pragma unroll
        for (int e = 0; e < LV; ++e) f[c + e] = to_f(pk.v[e]);
      }
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < VE; ++e) f[e] = d0 + e < D ? to_f(row[d0 + e]) : 0.f;
}

// Query row t's sequence (the last one starting at or before t: every sequence has at least one row)
// and the keys it sees in partition `part`, [k0, k1), empty when the partition lies past them.
struct RowKeys {
  int seq, k0, k1;
};
__device__ __forceinline__ RowKeys row_keys(const PagedParams& p, int t, int part) {
  int lo = 0, hi = p.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (p.query_starts[mid] <= t) lo = mid;
    else hi = mid - 1;
  }
  // Row i of n_s sits at position ctx - n_s + i and sees that many keys plus one.
  const int n_vis = p.context_lens[lo] - (p.query_starts[lo + 1] - t) + 1;
  const int k0 = part * p.part_len;
  return {lo, k0, min(n_vis, k0 + p.part_len)};
}

// s[g] += q[g][c .. c+V) . k[0 .. V) for the heads g < nh; q rows have pitch DP (floats, 16-byte aligned).
template <int NH, int V, int DP>
__device__ __forceinline__ void dot_pack(float (&s)[NH], const float* q, const float (&k)[V], int nh) {
#pragma unroll
  for (int g = 0; g < NH; ++g) {
    if (g < nh) {
#pragma unroll
      for (int e = 0; e < V; e += 4) {
        float4 qv = *reinterpret_cast<const float4*>(q + g * DP + e);
        s[g] = fmaf(qv.x, k[e], fmaf(qv.y, k[e + 1], fmaf(qv.z, k[e + 2], fmaf(qv.w, k[e + 3], s[g]))));
      }
    }
  }
}

// Grid (num_tokens, Hkv * head_slices, parts). DP: the head dim rounded up to a multiple of 32. NH:
// the query heads a block serves (a power of two up to kMaxHeads; heads past the group's are
// predicated off, but their instructions still issue, so NH follows the group size).
template <class T, int DP, int NH>
__global__ void __launch_bounds__(kThreads)
    paged_attention_kernel(T* out, const T* q, const T* k_cache, const T* v_cache, PagedParams p) {
  pdl_launch_dependents();  // the next kernel of a decode step may start (cuda_common.cuh)
  pdl_wait();               // launched as a dependent of the kernel ahead (launch_dependent)
  constexpr int VE = DP / 32;  // head dims per lane for the values and the output
  __shared__ __align__(16) float qsm[NH * DP];  // query rows; after the key loop, the merge buffer
  __shared__ __align__(16) float psm[kWarps][kChunk][NH];  // probabilities of a warp's 32 keys
  __shared__ float wm[kWarps][NH], wl[kWarps][NH], tot_l[NH];

  const int t = blockIdx.x, part = blockIdx.z;
  const int hk = blockIdx.y / p.head_slices, slice = blockIdx.y % p.head_slices;
  const int h0 = hk * p.group + slice * NH, nh = min(NH, p.group - slice * NH);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  // The query rows go into registers first: their loads need nothing the lookups below find.
  constexpr int kQPerThread = (NH * DP + kThreads - 1) / kThreads;
  const T* qrow = q + int64_t(t) * p.qs + int64_t(h0) * p.D;
  float qv[kQPerThread];
#pragma unroll
  for (int r = 0; r < kQPerThread; ++r) {
    const int i = threadIdx.x + r * kThreads, g = i / DP, d = i % DP;
    qv[r] = i < NH * DP && g < nh && d < p.D ? to_f(qrow[int64_t(g) * p.D + d]) * p.scale_log2 : 0.f;
  }

  const RowKeys rk = row_keys(p, t, part);
  const int seq = rk.seq, k0 = rk.k0, k1 = rk.k1;
  const int64_t ml0 = (int64_t(t) * p.Hq + h0) * p.parts + part;  // + g * parts for head h0 + g
  if (k0 >= k1) {  // a partition past this row's keys (partition 0 has a key unless context_lens < n_s)
    if (p.parts > 1) {
      if (threadIdx.x < nh) p.part_ml[ml0 + int64_t(threadIdx.x) * p.parts] = make_float2(-INFINITY, 0.f);
    } else {
      for (int i = threadIdx.x; i < nh * p.D; i += kThreads)
        out[int64_t(t) * p.os + int64_t(h0) * p.D + i] = from_f<T>(0.f);
    }
    return;
  }

  const int32_t* bt = p.block_tables + int64_t(seq) * p.max_blocks;
  const int bs_mask = (1 << p.log2_bs) - 1;
  auto slot_of = [&](int j) { return j < k1 ? (bt[j >> p.log2_bs] << p.log2_bs) | (j & bs_mask) : 0; };
  int slot = slot_of(k0 + warp * kChunk + lane);  // the first chunk's, in flight across the barrier
#pragma unroll
  for (int r = 0; r < kQPerThread; ++r)
    if (threadIdx.x + r * kThreads < NH * DP) qsm[threadIdx.x + r * kThreads] = qv[r];
  __syncthreads();

  float m[NH], l[NH], acc[NH][VE];
#pragma unroll
  for (int g = 0; g < NH; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int r = 0; r < VE; ++r) acc[g][r] = 0.f;
  }
  const int64_t slot_stride = int64_t(p.Hkv) * p.D;
  const T* kbase = k_cache + int64_t(hk) * p.D;
  const T* vbase = v_cache + int64_t(hk) * p.D;
  const int d0 = lane * VE;
  const bool v_packed = p.packed && p.D == DP;
  // Value rows in groups of kVGroup keys, all loads of a group issued before any use: the loads in
  // flight are what bounds a decode kernel. A value row's address needs only its key's slot (from
  // that key's lane), so the first group is loaded together with the keys, before the scores.
  constexpr int kVGroup = VE <= 2 ? 16 : VE <= 4 ? 8 : 4;  // 32 floats
  float vf[kVGroup][VE];
  auto load_values = [&](int jb, int n, int slot_of_lane) {
#pragma unroll
    for (int u = 0; u < kVGroup; ++u) {
      const int vs = __shfl_sync(0xffffffffu, slot_of_lane, (jb + u) & 31);  // n is the warp's: uniform
      if (jb + u < n) {
        load_slice<T, VE>(vf[u], vbase + int64_t(vs) * slot_stride, d0, p.D, v_packed);
      } else {
#pragma unroll
        for (int r = 0; r < VE; ++r) vf[u][r] = 0.f;
      }
    }
  };

  for (int j0 = k0 + warp * kChunk; j0 < k1; j0 += kWarps * kChunk) {
    const int j = j0 + lane;
    const bool valid = j < k1;
    const int n = min(kChunk, k1 - j0);
    load_values(0, n, slot);
    float s[NH];
#pragma unroll
    for (int g = 0; g < NH; ++g) s[g] = 0.f;
    if (valid) {
      const T* kr = kbase + int64_t(slot) * slot_stride;
      if (p.packed) {
        constexpr int V = 16 / int(sizeof(T));
#pragma unroll
        for (int c = 0; c < DP; c += V) {
          if (c < p.D) {  // D % V == 0 here, so the whole pack is inside the row
            Pack<T, V> pk = *reinterpret_cast<const Pack<T, V>*>(kr + c);
            float kf[V];
#pragma unroll
            for (int e = 0; e < V; ++e) kf[e] = to_f(pk.v[e]);
            dot_pack<NH, V, DP>(s, qsm + c, kf, nh);
          }
        }
      } else {
#pragma unroll 4
        for (int d = 0; d < p.D; ++d) {
          const float kf = to_f(kr[d]);
#pragma unroll
          for (int g = 0; g < NH; ++g)
            if (g < nh) s[g] = fmaf(qsm[g * DP + d], kf, s[g]);
        }
      }
    }
    // Online softmax per head; lane 0's key is always valid, so the new max is finite.
#pragma unroll
    for (int g = 0; g < NH; ++g) {
      float pj = 0.f;
      if (g < nh) {
        const float x = valid ? s[g] : -INFINITY;
        const float m_new = fmaxf(m[g], warp_max(x));
        const float alpha = exp2f(m[g] - m_new);
        pj = exp2f(x - m_new);
        l[g] = l[g] * alpha + warp_sum(pj);
        m[g] = m_new;
#pragma unroll
        for (int r = 0; r < VE; ++r) acc[g][r] *= alpha;
      }
      psm[warp][lane][g] = pj;
    }
    __syncwarp();
    const int slot_here = slot;
    slot = slot_of(j + kWarps * kChunk);  // the next chunk's, in flight during this one's values
    for (int jb = 0; jb < n; jb += kVGroup) {
      if (jb > 0) load_values(jb, n, slot_here);
#pragma unroll
      for (int u = 0; u < kVGroup; ++u) {
        // Keys past n have probability 0 (psm holds all 32 lanes), so no guard is needed here.
        float pw[NH];
        if constexpr (NH % 4 == 0) {
#pragma unroll
          for (int g = 0; g < NH; g += 4) {
            const float4 pa = *reinterpret_cast<const float4*>(&psm[warp][jb + u][g]);
            pw[g] = pa.x, pw[g + 1] = pa.y, pw[g + 2] = pa.z, pw[g + 3] = pa.w;
          }
        } else {
#pragma unroll
          for (int g = 0; g < NH; ++g) pw[g] = psm[warp][jb + u][g];
        }
#pragma unroll
        for (int g = 0; g < NH; ++g)
          if (g < nh)
#pragma unroll
            for (int r = 0; r < VE; ++r) acc[g][r] = fmaf(pw[g], vf[u][r], acc[g][r]);
      }
    }
    __syncwarp();  // psm is rewritten by the next step
  }

  // Merge the warps: rescale each to the block's max, then sum them into qsm one warp at a time.
  if (lane == 0)
#pragma unroll
    for (int g = 0; g < NH; ++g) {
      wm[warp][g] = m[g];
      wl[warp][g] = l[g];
    }
  __syncthreads();  // also: every warp is done reading qsm
  float f[NH];
#pragma unroll
  for (int g = 0; g < NH; ++g) {
    float mx = -INFINITY, sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, wm[w][g]);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += wm[w][g] == -INFINITY ? 0.f : wl[w][g] * exp2f(wm[w][g] - mx);
    f[g] = m[g] == -INFINITY ? 0.f : exp2f(m[g] - mx);  // a warp that had no key adds nothing
    if (threadIdx.x == 0) tot_l[g] = sum;
    if (threadIdx.x == g && p.parts > 1 && g < nh) p.part_ml[ml0 + int64_t(g) * p.parts] = make_float2(mx, sum);
  }
  float* buf = qsm;  // [NH][DP]
  for (int w = 0; w < kWarps; ++w) {
    if (warp == w)
#pragma unroll
      for (int g = 0; g < NH; ++g)
        if (g < nh)
#pragma unroll
          for (int r = 0; r < VE; ++r) {
            const float x = acc[g][r] * f[g];
            buf[g * DP + d0 + r] = w == 0 ? x : buf[g * DP + d0 + r] + x;
          }
    __syncthreads();
  }

  for (int i = threadIdx.x; i < nh * p.D; i += kThreads) {
    const int g = i / p.D, d = i % p.D;
    const float o = tot_l[g] > 0.f ? buf[g * DP + d] / tot_l[g] : 0.f;
    if (p.parts == 1) out[int64_t(t) * p.os + int64_t(h0 + g) * p.D + d] = from_f<T>(o);
    else p.part_o[(ml0 + int64_t(g) * p.parts) * p.D + d] = o;
  }
}

// The few-rows kernel's own combine: the block that finishes a (row, head)'s last partition merges
// all of them (as paged_combine_kernel does), which saves a kernel launch per layer. Each block
// publishes its partial with a fence before it counts itself in; the last resets the count. The
// launcher keeps parts <= kThreads, so each partition's weight is one thread's.
template <class T>
__device__ void combine_if_last(T* orow, const PagedParams& p, int64_t row_head) {
  __shared__ bool last;
  __shared__ float weight[kThreads];
  __shared__ float total;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(&p.done[row_head], 1u) == unsigned(p.parts - 1);
    if (last) p.done[row_head] = 0;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const float2* ml = p.part_ml + row_head * p.parts;
  const float* po = p.part_o + row_head * p.parts * p.D;
  const float2 mine = threadIdx.x < p.parts ? __ldcg(ml + threadIdx.x) : make_float2(-INFINITY, 0.f);
  const float mx = block_max(mine.y > 0.f ? mine.x : -INFINITY);
  // An empty partition (sum 0) was never written: weight 0, and it is skipped.
  const float w = mine.y > 0.f ? mine.y * exp2f(mine.x - mx) : 0.f;
  weight[threadIdx.x] = w;
  const float den = block_sum(w);
  if (threadIdx.x == 0) total = den;
  __syncthreads();
  for (int d = threadIdx.x; d < p.D; d += kThreads) {
    float num = 0.f;
    for (int i = 0; i < p.parts; ++i)
      if (weight[i] > 0.f) num = fmaf(weight[i], __ldcg(po + int64_t(i) * p.D + d), num);
    orow[d] = from_f<T>(total > 0.f ? num / total : 0.f);
  }
}

// The few-rows kernel: grid (num_tokens * Hq, parts), one query head per block, each warp taking its
// keys 8 at a time. A key's score is the dot product of 4 lanes' quarters of the head (a 2-step
// shuffle sum), so the 8 keys' rows load at once, and their value rows (lane = a slice of D/32
// dims) load with them. A warp's step is a few dozen instructions where the GQA kernel's is hundreds.
template <class T, int D>
__global__ void __launch_bounds__(kThreads)
    paged_decode_kernel(T* out, const T* q, const T* k_cache, const T* v_cache, PagedParams p) {
  pdl_launch_dependents();  // the next kernel of a decode step may start (cuda_common.cuh)
  constexpr int QD = D / 4, VD = D / 32, kKeys = 8;
  using QP = Pack<T, 8>;
  using VP = Pack<T, VD>;
  __shared__ float wm[kWarps], wl[kWarps];
  __shared__ __align__(16) float wacc[kWarps][D];
  const int t = blockIdx.x / p.Hq, h = blockIdx.x % p.Hq, part = blockIdx.y, hk = h / p.group;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, key = lane >> 2, quarter = lane & 3;
  // The block tables and lengths come from the host before the step, and the cache rows of the keys
  // earlier steps wrote are read by nothing and written by nothing in this step: those load before
  // the wait. The query and this step's own keys come from the kernel ahead, after it.
  const RowKeys rk = row_keys(p, t, part);
  const int seq = rk.seq, k0 = rk.k0, k1 = rk.k1;
  const int earlier = p.context_lens[seq] - (p.query_starts[seq + 1] - p.query_starts[seq]);
  const int64_t row_head = int64_t(t) * p.Hq + h, ml = row_head * p.parts + part;
  T* orow = out + int64_t(t) * p.os + int64_t(h) * D;
  if (k0 >= k1) {
    pdl_wait();
    if (p.parts > 1) {
      if (threadIdx.x == 0) p.part_ml[ml] = make_float2(-INFINITY, 0.f);
      if (p.done) combine_if_last(orow, p, row_head);
    } else {
      for (int d = threadIdx.x; d < D; d += kThreads) orow[d] = from_f<T>(0.f);
    }
    return;
  }
  const int32_t* bt = p.block_tables + int64_t(seq) * p.max_blocks;
  const int bs_mask = (1 << p.log2_bs) - 1;
  const int64_t slot_stride = int64_t(p.Hkv) * D;
  const T* kbase = k_cache + int64_t(hk) * D + quarter * QD;
  const T* vbase = v_cache + int64_t(hk) * D + lane * VD;
  // A step of the warp: its 8 keys from j0, the lane's key row (a quarter of it) and the 8 value rows
  // (a slice each), those at positions [lo, hi) loaded.
  QP kp[QD / 8];
  VP vp[kKeys];
  int slot = 0;
  auto load = [&](int j0, int lo, int hi) {
    const int j = j0 + key;
    slot = j < k1 ? (bt[j >> p.log2_bs] << p.log2_bs) | (j & bs_mask) : 0;
    if (j < k1 && j >= lo && j < hi) {
      const QP* kr = reinterpret_cast<const QP*>(kbase + int64_t(slot) * slot_stride);
#pragma unroll
      for (int c = 0; c < QD / 8; ++c) kp[c] = kr[c];
    }
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      const int vs = __shfl_sync(0xffffffffu, slot, 4 * u);
      if (j0 + u < k1 && j0 + u >= lo && j0 + u < hi)
        vp[u] = *reinterpret_cast<const VP*>(vbase + int64_t(vs) * slot_stride);
    }
  };
  const int first = k0 + warp * kKeys;
  if (first < k1) load(first, 0, earlier);
  pdl_wait();  // launched as a dependent of the kernel ahead (launch_dependent)

  float qf[QD];
  {
    const QP* qr = reinterpret_cast<const QP*>(q + int64_t(t) * p.qs + int64_t(h) * D + quarter * QD);
#pragma unroll
    for (int c = 0; c < QD / 8; ++c) {
      const QP v = qr[c];
#pragma unroll
      for (int e = 0; e < 8; ++e) qf[c * 8 + e] = to_f(v.v[e]) * p.scale_log2;
    }
  }
  float m = -INFINITY, l = 0.f, acc[VD];
#pragma unroll
  for (int r = 0; r < VD; ++r) acc[r] = 0.f;
  for (int j0 = first; j0 < k1; j0 += kWarps * kKeys) {
    if (j0 == first) load(j0, earlier, k1);  // this step's keys, if any, on top of the early loads
    else load(j0, 0, k1);
    const int j = j0 + key;
    const bool valid = j < k1;
    float sc = 0.f;
    if (valid)
#pragma unroll
      for (int c = 0; c < QD / 8; ++c)
#pragma unroll
        for (int e = 0; e < 8; ++e) sc = fmaf(qf[c * 8 + e], to_f(kp[c].v[e]), sc);
    sc += __shfl_xor_sync(0xffffffffu, sc, 1);
    sc += __shfl_xor_sync(0xffffffffu, sc, 2);
    const float x = valid ? sc : -INFINITY;
    float mx = x;
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float m_new = fmaxf(m, mx);  // key 0 of the step is valid: finite
    const float alpha = exp2f(m - m_new);
    const float pj = exp2f(x - m_new);
    float sum = pj;
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    l = l * alpha + sum;
    m = m_new;
#pragma unroll
    for (int r = 0; r < VD; ++r) acc[r] *= alpha;
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      const float pu = __shfl_sync(0xffffffffu, pj, 4 * u);  // 0 past k1
      if (j0 + u < k1)
#pragma unroll
        for (int r = 0; r < VD; ++r) acc[r] = fmaf(pu, to_f(vp[u].v[r]), acc[r]);
    }
  }

  if (lane == 0) wm[warp] = m, wl[warp] = l;
#pragma unroll
  for (int r = 0; r < VD; ++r) wacc[warp][lane * VD + r] = acc[r];
  __syncthreads();
  float mx = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, wm[w]);
  float f[kWarps], tot = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    f[w] = wm[w] == -INFINITY ? 0.f : exp2f(wm[w] - mx);  // a warp that had no key adds nothing
    tot += wl[w] * f[w];
  }
  if (p.parts > 1 && threadIdx.x == 0) p.part_ml[ml] = make_float2(mx, tot);
  for (int d = threadIdx.x; d < D; d += kThreads) {
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o = fmaf(wacc[w][d], f[w], o);
    o = tot > 0.f ? o / tot : 0.f;
    if (p.parts == 1) orow[d] = from_f<T>(o);
    else p.part_o[ml * D + d] = o;
  }
  if (p.done) combine_if_last(orow, p, row_head);
}

// The batched path on tensor cores: grid (num_tokens, Hkv, parts), a block per (row, kv head) with
// the whole query group (at most 16 heads, padded to the 16 rows of an mma tile). Each warp takes
// 16-key tiles of the partition in turn, loads them with cp.async into its own two buffers (the next
// tile in flight while the current one is used), and runs S = Q K^T and O += P V as mma.sync with
// P straight from the score accumulators (kernels/cuda/mma.cuh, as the flash forward does), keeping
// its own online softmax on raw scores; the warps merge through shared memory at the end. Per key a
// warp issues a few tensor-core instructions where the FMA kernel above issues hundreds: at 64 rows
// of a Llama-3.2-1B step that kernel waited out 15 cycles an instruction (ncu) over 4,600
// instructions a warp.
constexpr int kMmaKeys = 16;  // keys per warp tile

template <class T, int D>
struct MmaTiles {
  static constexpr int kPitch = D + 8;  // an odd number of 16-byte chunks: ldmatrix without conflicts
  static constexpr size_t kTile = size_t(kMmaKeys) * kPitch;  // elements of one K or V tile
  static constexpr size_t kQ = 16 * size_t(kPitch);
  static constexpr size_t kTiles = size_t(kWarps) * 4 * kTile;  // per warp: two buffers of K and V
  // The merge reuses the tiles: each warp's O [16][D] and its row maxima and sums, in fp32.
  static constexpr size_t kMergeBytes = (size_t(kWarps) * 16 * D + 2 * kWarps * 16) * sizeof(float);
  static_assert(kMergeBytes <= kTiles * sizeof(T), "the merge buffer fits in the tiles");
  static constexpr size_t kBytes = (kQ + kTiles) * sizeof(T);
};

template <class T, int D>
__global__ void __launch_bounds__(kThreads)
    paged_gqa_mma_kernel(T* out, const T* q, const T* k_cache, const T* v_cache, PagedParams p) {
  pdl_launch_dependents();  // the next kernel of a decode step may start (cuda_common.cuh)
  pdl_wait();               // launched as a dependent of the kernel ahead (launch_dependent)
  using L = MmaTiles<T, D>;
  constexpr int kPitch = L::kPitch, kKT = D / 16, kDT = D / 8;
  extern __shared__ __align__(16) unsigned char paged_smem[];
  T* Qs = reinterpret_cast<T*>(paged_smem);
  T* tiles = Qs + L::kQ;
  const int t = blockIdx.x, hk = blockIdx.y, part = blockIdx.z, G = p.group, h0 = hk * G;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const LaneOffsets lo(lane);

  // The group's query rows (rows past G stay zero: their scores are 0 and never written out).
  const T* qrow = q + int64_t(t) * p.qs + int64_t(h0) * D;
  for (int c = threadIdx.x; c < 16 * (D / 8); c += kThreads) {
    const int r = c / (D / 8), ch = c % (D / 8);
    cp_async_16(Qs + r * kPitch + ch * 8, r < G ? qrow + int64_t(r) * D + ch * 8 : qrow, r < G);
  }
  cp_async_commit();

  const RowKeys rk = row_keys(p, t, part);
  const int k0 = rk.k0, k1 = rk.k1;
  const int64_t ml0 = (int64_t(t) * p.Hq + h0) * p.parts + part;  // + g * parts for head h0 + g
  if (k0 >= k1) {  // a partition past this row's keys
    cp_async_wait<0>();
    if (p.parts > 1) {
      if (threadIdx.x < G) p.part_ml[ml0 + int64_t(threadIdx.x) * p.parts] = make_float2(-INFINITY, 0.f);
    } else {
      for (int i = threadIdx.x; i < G * D; i += kThreads) out[int64_t(t) * p.os + int64_t(h0) * D + i] = from_f<T>(0.f);
    }
    return;
  }
  const int32_t* bt = p.block_tables + int64_t(rk.seq) * p.max_blocks;
  const int bs_mask = (1 << p.log2_bs) - 1;
  const int64_t slot_stride = int64_t(p.Hkv) * D;
  const T* kbase = k_cache + int64_t(hk) * D;
  const T* vbase = v_cache + int64_t(hk) * D;
  T* mine = tiles + size_t(warp) * 4 * L::kTile;
  // Keys [j0, j0 + 16) into buffer `buf` of this warp (keys past k1 zero-filled, nothing read).
  auto load_tile = [&](int j0, int buf) {
    T* kt = mine + size_t(buf) * 2 * L::kTile;
    T* vt = kt + L::kTile;
    constexpr int kChunks = kMmaKeys * (D / 8);
#pragma unroll
    for (int i = 0; i < kChunks / 32; ++i) {
      const int c = lane + 32 * i, r = c / (D / 8), ch = c % (D / 8), j = j0 + r;
      const bool ok = j < k1;
      const int64_t at = ok ? int64_t((bt[j >> p.log2_bs] << p.log2_bs) | (j & bs_mask)) * slot_stride + ch * 8 : 0;
      cp_async_16(kt + r * kPitch + ch * 8, kbase + at, ok);
      cp_async_16(vt + r * kPitch + ch * 8, vbase + at, ok);
    }
  };
  constexpr int kRound = kWarps * kMmaKeys;  // keys a round of the block's warps takes
  int j0 = k0 + warp * kMmaKeys;
  if (j0 < k1) load_tile(j0, 0);
  cp_async_commit();
  cp_async_wait<1>();  // this thread's query chunks
  __syncthreads();     // everyone's
  uint32_t qf[kKT][4];
#pragma unroll
  for (int kk = 0; kk < kKT; ++kk) ldsm_x4(qf[kk], Qs + lo.a_row * kPitch + kk * 16 + lo.a_col);

  float o[kDT][4];
#pragma unroll
  for (int i = 0; i < kDT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // rows g and g + 8: raw-score max, partial sums
  for (int it = 0; j0 < k1; ++it, j0 += kRound) {
    const int buf = it & 1;
    if (j0 + kRound < k1) load_tile(j0 + kRound, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // the current tile, committed a round earlier
    __syncwarp();
    const T* kt = mine + size_t(buf) * 2 * L::kTile;
    const T* vt = kt + L::kTile;

    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kk = 0; kk < kKT; ++kk) {
      uint32_t bb[4];
      ldsm_x4(bb, kt + lo.b_row * kPitch + kk * 16 + lo.b_col);
      mma_16816<T>(s[0], qf[kk], bb[0], bb[1]);
      mma_16816<T>(s[1], qf[kk], bb[2], bb[3]);
    }
    if (j0 + kMmaKeys > k1)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (j0 + nt * 8 + 2 * tq + (e & 1) >= k1) s[nt][e] = -INFINITY;
    // The tile's first key is below k1, so every row's maximum is finite (padding rows score 0).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = fmaxf(m[r], fmaxf(fmaxf(s[0][2 * r], s[0][2 * r + 1]), fmaxf(s[1][2 * r], s[1][2 * r + 1])));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float base = mx * p.scale_log2;
      const float alpha = fast_exp2(fmaf(m[r], p.scale_log2, -base));  // 0 on the first tile
      m[r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        s[nt][2 * r] = fast_exp2(fmaf(s[nt][2 * r], p.scale_log2, -base));
        s[nt][2 * r + 1] = fast_exp2(fmaf(s[nt][2 * r + 1], p.scale_log2, -base));
        sum += s[nt][2 * r] + s[nt][2 * r + 1];
      }
      l[r] = l[r] * alpha + sum;
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) {
        o[dt][2 * r] *= alpha;
        o[dt][2 * r + 1] *= alpha;
      }
    }
    uint32_t a[4];
    acc_to_a<T>(a, s[0], s[1]);
#pragma unroll
    for (int dp = 0; dp < kDT / 2; ++dp) {
      uint32_t bb[4];
      ldsm_x4_t(bb, vt + lo.a_row * kPitch + dp * 16 + lo.a_col);
      mma_16816<T>(o[2 * dp], a, bb[0], bb[1]);
      mma_16816<T>(o[2 * dp + 1], a, bb[2], bb[3]);
    }
    __syncwarp();  // this buffer is refilled by the next round's prefetch
  }
  cp_async_wait<0>();

  // Merge the warps: each stages its O rows and its rows' maxima and sums over the tiles.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  __syncthreads();  // every warp is done with its tiles
  float* wo = reinterpret_cast<float*>(tiles);  // [kWarps][16][D]
  float* wm = wo + kWarps * 16 * D;             // [kWarps][16]
  float* wl = wm + kWarps * 16;                 // [kWarps][16]
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = g + 8 * r;
    if (tq == 0) {
      wm[warp * 16 + row] = m[r];  // -inf for a warp that had no tile
      wl[warp * 16 + row] = l[r];
    }
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
      wo[(warp * 16 + row) * D + dt * 8 + 2 * tq] = o[dt][2 * r];
      wo[(warp * 16 + row) * D + dt * 8 + 2 * tq + 1] = o[dt][2 * r + 1];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * D; i += kThreads) {
    const int row = i / D, d = i % D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, wm[w * 16 + row]);
    float num = 0.f, den = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = wm[w * 16 + row];
      if (mw == -INFINITY) continue;
      const float f = fast_exp2((mw - mx) * p.scale_log2);
      num = fmaf(f, wo[(w * 16 + row) * D + d], num);
      den = fmaf(f, wl[w * 16 + row], den);
    }
    const float val = den > 0.f ? num / den : 0.f;
    if (p.parts == 1) {
      out[int64_t(t) * p.os + int64_t(h0 + row) * D + d] = from_f<T>(val);
    } else {
      p.part_o[(ml0 + int64_t(row) * p.parts) * D + d] = val;
      if (d == 0) p.part_ml[ml0 + int64_t(row) * p.parts] = make_float2(mx * p.scale_log2, den);
    }
  }
}

// Grid (num_tokens, Hq): out = sum over partitions of sum_p * 2^(max_p - max) * o_p, normalised.
template <class T>
__global__ void paged_combine_kernel(T* out, const float* part_o, const float2* part_ml, int Hq, int D, int parts,
                                     int64_t os) {
  pdl_launch_dependents();  // the next kernel of a decode step may start (cuda_common.cuh)
  pdl_wait();               // launched as a dependent of the kernel ahead (launch_dependent)
  const int t = blockIdx.x, h = blockIdx.y;
  const int64_t base = (int64_t(t) * Hq + h) * parts;
  float mx = -INFINITY;
  for (int i = 0; i < parts; ++i) {
    const float2 ml = part_ml[base + i];
    if (ml.y > 0.f) mx = fmaxf(mx, ml.x);
  }
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float num = 0.f, den = 0.f;
    for (int i = 0; i < parts; ++i) {
      const float2 ml = part_ml[base + i];
      if (ml.y > 0.f) {  // an empty partition's output was never written
        const float w = ml.y * exp2f(ml.x - mx);
        den += w;
        num = fmaf(w, part_o[(base + i) * D + d], num);
      }
    }
    out[int64_t(t) * os + int64_t(h) * D + d] = from_f<T>(den > 0.f ? num / den : 0.f);
  }
}

// ZP_PAGED_MMA=0 keeps the batched path on the FMA kernel, to compare or to rule the tensor-core one out.
bool paged_mma_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("ZP_PAGED_MMA");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

template <class F> void dispatch_dp(int64_t D, F&& f) {
  if (D <= 64) f(std::integral_constant<int, 64>{});
  else if (D <= 96) f(std::integral_constant<int, 96>{});
  else if (D <= 128) f(std::integral_constant<int, 128>{});
  else f(std::integral_constant<int, 256>{});
}

template <class F> void dispatch_heads(int nh, F&& f) {
  if (nh == 1) f(std::integral_constant<int, 1>{});
  else if (nh == 2) f(std::integral_constant<int, 2>{});
  else if (nh == 4) f(std::integral_constant<int, 4>{});
  else f(std::integral_constant<int, kMaxHeads>{});
}

}  // namespace

void kv_cache_write(StreamHandle s, DType dt, void* k_cache, void* v_cache, const void* k, const void* v, int64_t N,
                    int64_t Hkv, int64_t D, int64_t k_stride, int64_t v_stride, const int32_t* slots,
                    int64_t block_size) {
  ZP_CHECK(N >= 0 && Hkv > 0 && D > 0 && block_size > 0);
  const int64_t W = Hkv * D, ks = k_stride ? k_stride : W, vs = v_stride ? v_stride : W;
  ZP_CHECK(ks >= W && vs >= W, "kv_cache_write: row stride too small");
  if (N == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    constexpr int V = 16 / int(sizeof(T));
    auto launch = [&](auto vec) {
      constexpr int VEC = decltype(vec)::value;
      const unsigned blocks = std::min(ceil_div(N * (W / VEC), 256), unsigned(sm_count()) * 32u);
      launch_dependent(kv_cache_write_kernel<T, VEC>, dim3(blocks), dim3(256), 0, s, static_cast<T*>(k_cache),
                       static_cast<T*>(v_cache), static_cast<const T*>(k), static_cast<const T*>(v), N, W, ks, vs,
                       slots);
    };
    if (can_vectorise<T>(W, {k_cache, v_cache, k, v}) && ks % V == 0 && vs % V == 0)
      launch(std::integral_constant<int, V>{});
    else
      launch(std::integral_constant<int, 1>{});
  });
  ZP_CUDA_LAUNCH_CHECK();
}

void paged_attention_forward(StreamHandle s, DType dt, void* out, const void* q, const void* k_cache,
                             const void* v_cache, const int32_t* block_tables, int64_t max_blocks,
                             const int32_t* context_lens, const int32_t* query_starts, int64_t num_seqs,
                             int64_t num_tokens, int64_t max_context_len, int64_t Hq, int64_t Hkv, int64_t D,
                             int64_t block_size, int64_t q_stride, int64_t o_stride, float scale) {
  ZP_CHECK(num_seqs >= 0 && num_tokens >= 0 && Hq > 0 && Hkv > 0 && max_blocks >= 0);
  ZP_CHECK(Hq % Hkv == 0, "Hq ", Hq, " is not a multiple of Hkv ", Hkv);
  ZP_CHECK(D > 0 && D <= 256, "paged_attention_forward: head dim ", D, " is not in 1..256");
  ZP_CHECK(block_size > 0 && std::has_single_bit(uint64_t(block_size)), "block_size ", block_size,
           " is not a power of two");
  const int64_t qs = q_stride ? q_stride : Hq * D, os = o_stride ? o_stride : Hq * D;
  ZP_CHECK(qs >= Hq * D && os >= Hq * D, "paged_attention_forward: row stride too small");
  if (num_tokens == 0) return;
  ZP_CHECK(num_seqs > 0 && max_context_len > 0 && max_context_len < INT_MAX && num_tokens < INT_MAX,
           "paged_attention_forward: ", num_tokens, " rows of ", num_seqs, " sequences, max context ",
           max_context_len);

  PagedParams p{};
  p.block_tables = block_tables;
  p.context_lens = context_lens;
  p.query_starts = query_starts;
  p.max_blocks = max_blocks;
  p.qs = qs;
  p.os = os;
  p.num_seqs = int(num_seqs);
  p.Hq = int(Hq);
  p.Hkv = int(Hkv);
  p.D = int(D);
  p.group = int(Hq / Hkv);
  p.log2_bs = std::countr_zero(uint64_t(block_size));
  p.scale_log2 = scale * kLog2e;

  // Fewer (row, kv head) pairs than SMs, 16-bit, a head dim of 64, 128 or 256: the few-rows kernel, a
  // block per query head, the context split for about eight blocks per SM. (Taking it up to 4 pairs
  // an SM made the 1B model's 64-sequence decode slower on an H200, 32.0k -> 25.3k tokens/s: the GQA
  // kernel reads each key row once for its 4 query heads.)
  const int64_t sms = sm_count();
  const bool aligned16 = [&] {
    for (const void* ptr : {q, k_cache, v_cache})
      if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return false;
    return true;
  }();
  if (num_tokens * Hkv < sms && (D == 64 || D == 128 || D == 256) && dt != DType::F32 && aligned16 && qs % 8 == 0) {
    const int64_t heads = num_tokens * Hq, want = (8 * sms + heads - 1) / heads, round = kWarps * 8;
    const int64_t len = std::max<int64_t>(round, ((max_context_len + want - 1) / want + round - 1) / round * round);
    // At most kThreads partitions (the combine's), and partitions of at least `round` keys.
    const int64_t min_len = (max_context_len + kThreads - 1) / kThreads;
    p.part_len = int(std::max<int64_t>(len, (min_len + round - 1) / round * round));
    p.parts = int((max_context_len + p.part_len - 1) / p.part_len);
    const int64_t n_part = p.parts > 1 ? num_tokens * Hq * p.parts : 0;
    KernelScratch scratch(s, size_t(n_part) * (sizeof(float2) + sizeof(float) * size_t(D)), "paged attention partials");
    p.part_ml = scratch.as<float2>();
    p.part_o = p.parts > 1 ? reinterpret_cast<float*>(p.part_ml + n_part) : nullptr;
    // Counters for the fused combine: kMaxDoneCounters per stream, zeroed once and left at zero by
    // every kernel; more (row, head) pairs than that fall back to paged_combine_kernel.
    const bool fused = p.parts > 1 && heads <= kMaxDoneCounters;
    p.done = fused ? static_cast<unsigned*>(zeroed_stream_workspace(s, kMaxDoneCounters * sizeof(unsigned),
                                                                    "paged attention counters"))
                   : nullptr;
    ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
      auto go = [&](auto d) {
        constexpr int DD = decltype(d)::value;
        if constexpr (sizeof(T) == 2)  // never fp32 (above); no fp32 kernels are built
          launch_dependent(paged_decode_kernel<T, DD>, dim3(unsigned(num_tokens * Hq), unsigned(p.parts)),
                           dim3(kThreads), 0, s, static_cast<T*>(out), static_cast<const T*>(q),
                           static_cast<const T*>(k_cache), static_cast<const T*>(v_cache), p);
      };
      if (D == 64) go(std::integral_constant<int, 64>{});
      else if (D == 128) go(std::integral_constant<int, 128>{});
      else go(std::integral_constant<int, 256>{});
      ZP_CUDA_LAUNCH_CHECK();
      if (p.parts > 1 && !fused)
        launch_dependent(paged_combine_kernel<T>, dim3(unsigned(num_tokens), unsigned(Hq)), dim3(128), 0, s,
                         static_cast<T*>(out), p.part_o, p.part_ml, p.Hq, p.D, p.parts, os);
    });
    ZP_CUDA_LAUNCH_CHECK();
    return;
  }

  // Heads per block: the group rounded up to a power of two (at most kMaxHeads), halved while the
  // grid leaves SMs idle. With few rows each block is alone on its SM, where one warp per scheduler
  // waits out every instruction's latency (12.6 cycles an instruction, 25 us for 256 keys of one
  // Llama-3.2-1B row with 4 heads a block), so fewer heads a block is proportionally less time; the
  // blocks of one kv head then read its keys and values from L2 more than once.
  // The tensor-core kernel takes the whole group (up to 16 heads) of 16-bit rows of 64 or 128 dims.
  const bool mma = paged_mma_enabled() && dt != DType::F32 && (D == 64 || D == 128) && p.group <= 16 && aligned16 &&
                   qs % 8 == 0;
  int nh = 1;
  while (!mma && nh < kMaxHeads && nh < p.group) nh *= 2;
  while (!mma && nh > 1 && num_tokens * Hkv * ((p.group + nh - 1) / nh) < sms) nh /= 2;
  p.head_slices = mma ? 1 : (p.group + nh - 1) / nh;

  // Split the context only when the unsplit grid leaves SMs idle; aim at about two blocks per SM.
  const int64_t pairs = num_tokens * Hkv * p.head_slices;
  p.part_len = int(max_context_len);
  p.parts = 1;
  if (pairs < sms) {
    const int64_t want = (2 * sms + pairs - 1) / pairs;
    const int64_t round = kWarps * kChunk;
    const int64_t len = std::max<int64_t>(kMinPart, ((max_context_len + want - 1) / want + round - 1) / round * round);
    if (len < max_context_len) {
      p.part_len = int(len);
      p.parts = int((max_context_len + len - 1) / len);
    }
  }
  const int64_t n_part = p.parts > 1 ? num_tokens * Hq * p.parts : 0;
  KernelScratch scratch(s, size_t(n_part) * (sizeof(float2) + sizeof(float) * size_t(D)), "paged attention partials");
  p.part_ml = scratch.as<float2>();
  p.part_o = p.parts > 1 ? reinterpret_cast<float*>(p.part_ml + n_part) : nullptr;

  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    p.packed = can_vectorise<T>(D, {k_cache, v_cache});
    if (mma) {
      auto go = [&](auto d) {
        constexpr int DD = decltype(d)::value;
        if constexpr (sizeof(T) == 2) {  // never fp32 (above)
          // Once per process (a rank drives one GPU), at the first, eager use: a decode step's graph is
          // captured later, and the attribute calls stay out of the capture.
          static const bool smem_allowed = [] {
            allow_dynamic_smem(paged_gqa_mma_kernel<T, DD>, MmaTiles<T, DD>::kBytes, "paged attention (tensor cores)");
            return true;
          }();
          (void)smem_allowed;
          launch_dependent(paged_gqa_mma_kernel<T, DD>, dim3(unsigned(num_tokens), unsigned(Hkv), unsigned(p.parts)),
                           dim3(kThreads), MmaTiles<T, DD>::kBytes, s, static_cast<T*>(out), static_cast<const T*>(q),
                           static_cast<const T*>(k_cache), static_cast<const T*>(v_cache), p);
        }
      };
      if (D == 64) go(std::integral_constant<int, 64>{});
      else go(std::integral_constant<int, 128>{});
    } else {
      dispatch_dp(D, [&](auto dp) {
        dispatch_heads(nh, [&](auto heads) {
          constexpr int DP = decltype(dp)::value, NH = decltype(heads)::value;
          dim3 grid(unsigned(num_tokens), unsigned(Hkv * p.head_slices), unsigned(p.parts));
          launch_dependent(paged_attention_kernel<T, DP, NH>, grid, dim3(kThreads), 0, s, static_cast<T*>(out),
                           static_cast<const T*>(q), static_cast<const T*>(k_cache), static_cast<const T*>(v_cache), p);
        });
      });
    }
    ZP_CUDA_LAUNCH_CHECK();
    if (p.parts > 1)
      launch_dependent(paged_combine_kernel<T>, dim3(unsigned(num_tokens), unsigned(Hq)), dim3(128), 0, s,
                       static_cast<T*>(out), p.part_o, p.part_ml, p.Hq, p.D, p.parts, os);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace zp::kernels::cuda
