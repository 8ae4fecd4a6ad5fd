// Paged attention on the GPU (flash-decoding).
//
// kv_cache_write is a scatter: one thread per 16-byte pack of a token's row (per element when the rows
// or pointers do not allow packs), sent to slot * Hkv * D.
//
// paged_attention_forward: one thread block per (query row, kv head, slice of up to 8 of the query
// heads that read it, partition of the keys). All those query heads are handled together, so a block
// reads each key and value row from global memory once, whatever the GQA group size (up to 8; larger
// groups take ceil(group / 8) blocks). Decoding is bound by reading the cache, so the work is laid
// out for wide independent loads rather than for arithmetic:
//  - Each warp owns 32 consecutive keys at a time and keeps its own online softmax (no barrier inside
//    the key loop). Scores: lane = key; each lane reads its whole key row in 16-byte packs (its slot
//    from the block table) and dots it with the 8 query rows, which sit pre-scaled by scale*log2(e)
//    in shared memory and are read as float4 broadcasts. Values: lane = a slice of DP/32 consecutive
//    head dims, so one value row is one coalesced warp load; the 32 probabilities and slots go through
//    a small per-warp shared buffer.
//  - At the end the 4 warps' (max, sum, acc) are merged in shared memory.
// When (rows x kv heads x head slices) alone cannot fill the SMs, the context is cut into partitions
// (at least 128 keys, sized for about two blocks per SM); each block then writes its normalised partial
// output and (max, sum) to KernelScratch and a second kernel combines the partitions. A batch that fills
// the GPU runs one partition: the first kernel writes the output directly.
// Every query row is independent (its sequence found by a binary search over query_starts and its own
// visible length), so prefill chunks run correctly too, just without tuning.
#include <algorithm>
#include <bit>
#include <climits>
#include <type_traits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/scratch.cuh"
#include "kernels/paged_attention.h"

namespace zp::kernels::cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// kv_cache_write

template <class T, int VEC>
__global__ void kv_cache_write_kernel(T* kc, T* vc, const T* k, const T* v, int64_t N, int64_t W, int64_t ks,
                                      int64_t vs, const int32_t* slots) {
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
constexpr int kHeads = 8;      // query heads per block
constexpr int kChunk = 32;     // keys per warp step (lane = key)
constexpr int kMinPart = 128;  // keys per partition, at least, when the context is split
constexpr float kLog2e = 1.4426950408889634f;

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

// s[g] += q[g][c .. c+V) . k[0 .. V) for the heads g < nh; q rows have pitch DP (floats, 16-byte aligned).
template <int V, int DP>
__device__ __forceinline__ void dot_pack(float (&s)[kHeads], const float* q, const float (&k)[V], int nh) {
#pragma unroll
  for (int g = 0; g < kHeads; ++g) {
    if (g < nh) {
#pragma unroll
      for (int e = 0; e < V; e += 4) {
        float4 qv = *reinterpret_cast<const float4*>(q + g * DP + e);
        s[g] = fmaf(qv.x, k[e], fmaf(qv.y, k[e + 1], fmaf(qv.z, k[e + 2], fmaf(qv.w, k[e + 3], s[g]))));
      }
    }
  }
}

// Grid (num_tokens, Hkv * head_slices, parts). DP: the head dim rounded up to a multiple of 32.
template <class T, int DP>
__global__ void __launch_bounds__(kThreads)
    paged_attention_kernel(T* out, const T* q, const T* k_cache, const T* v_cache, PagedParams p) {
  constexpr int VE = DP / 32;  // head dims per lane for the values and the output
  __shared__ __align__(16) float qsm[kHeads * DP];  // query rows; after the key loop, the merge buffer
  __shared__ __align__(16) float psm[kWarps][kChunk][kHeads];  // probabilities of a warp's 32 keys
  __shared__ int slot_sm[kWarps][kChunk];
  __shared__ float wm[kWarps][kHeads], wl[kWarps][kHeads], tot_l[kHeads];

  const int t = blockIdx.x, part = blockIdx.z;
  const int hk = blockIdx.y / p.head_slices, slice = blockIdx.y % p.head_slices;
  const int h0 = hk * p.group + slice * kHeads, nh = min(kHeads, p.group - slice * kHeads);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  // The row's sequence: the last one starting at or before t (every sequence has at least one row).
  int lo = 0, hi = p.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (p.query_starts[mid] <= t) lo = mid;
    else hi = mid - 1;
  }
  const int seq = lo;
  // Row i of n_s sits at position ctx - n_s + i and sees that many keys plus one.
  const int n_vis = p.context_lens[seq] - (p.query_starts[seq + 1] - t) + 1;
  const int k0 = part * p.part_len, k1 = min(n_vis, k0 + p.part_len);
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

  const T* qrow = q + int64_t(t) * p.qs + int64_t(h0) * p.D;
  for (int i = threadIdx.x; i < kHeads * DP; i += kThreads) {
    const int g = i / DP, d = i % DP;
    qsm[i] = g < nh && d < p.D ? to_f(qrow[int64_t(g) * p.D + d]) * p.scale_log2 : 0.f;
  }
  __syncthreads();

  float m[kHeads], l[kHeads], acc[kHeads][VE];
#pragma unroll
  for (int g = 0; g < kHeads; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int r = 0; r < VE; ++r) acc[g][r] = 0.f;
  }
  const int32_t* bt = p.block_tables + int64_t(seq) * p.max_blocks;
  const int bs_mask = (1 << p.log2_bs) - 1;
  const int64_t slot_stride = int64_t(p.Hkv) * p.D;
  const T* kbase = k_cache + int64_t(hk) * p.D;
  const T* vbase = v_cache + int64_t(hk) * p.D;
  const int d0 = lane * VE;
  const bool v_packed = p.packed && p.D == DP;

  for (int j0 = k0 + warp * kChunk; j0 < k1; j0 += kWarps * kChunk) {
    const int j = j0 + lane;
    const bool valid = j < k1;
    const int slot = valid ? (bt[j >> p.log2_bs] << p.log2_bs) | (j & bs_mask) : 0;
    float s[kHeads];
#pragma unroll
    for (int g = 0; g < kHeads; ++g) s[g] = 0.f;
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
            dot_pack<V, DP>(s, qsm + c, kf, nh);
          }
        }
      } else {
#pragma unroll 4
        for (int d = 0; d < p.D; ++d) {
          const float kf = to_f(kr[d]);
#pragma unroll
          for (int g = 0; g < kHeads; ++g)
            if (g < nh) s[g] = fmaf(qsm[g * DP + d], kf, s[g]);
        }
      }
    }
    // Online softmax per head; lane 0's key is always valid, so the new max is finite.
#pragma unroll
    for (int g = 0; g < kHeads; ++g) {
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
    slot_sm[warp][lane] = slot;
    __syncwarp();
    // Value rows in groups of kVGroup keys, all loads of a group issued before any use: the loads
    // in flight are what bounds a decode kernel.
    constexpr int kVGroup = VE <= 4 ? 8 : 4;
    const int n = min(kChunk, k1 - j0);
    for (int jb = 0; jb < n; jb += kVGroup) {
      float vf[kVGroup][VE];
#pragma unroll
      for (int u = 0; u < kVGroup; ++u) {
        if (jb + u < n) {
          load_slice<T, VE>(vf[u], vbase + int64_t(slot_sm[warp][jb + u]) * slot_stride, d0, p.D, v_packed);
        } else {
#pragma unroll
          for (int r = 0; r < VE; ++r) vf[u][r] = 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < kVGroup; ++u) {
        // Keys past n have probability 0 (psm holds all 32 lanes), so no guard is needed here.
        const float4 pa = *reinterpret_cast<const float4*>(&psm[warp][jb + u][0]);
        const float4 pb = *reinterpret_cast<const float4*>(&psm[warp][jb + u][4]);
        const float pw[kHeads] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
#pragma unroll
        for (int g = 0; g < kHeads; ++g)
          if (g < nh)
#pragma unroll
            for (int r = 0; r < VE; ++r) acc[g][r] = fmaf(pw[g], vf[u][r], acc[g][r]);
      }
    }
    __syncwarp();  // psm and slot_sm are rewritten by the next step
  }

  // Merge the warps: rescale each to the block's max, then sum them into qsm one warp at a time.
  if (lane == 0)
#pragma unroll
    for (int g = 0; g < kHeads; ++g) {
      wm[warp][g] = m[g];
      wl[warp][g] = l[g];
    }
  __syncthreads();  // also: every warp is done reading qsm
  float f[kHeads];
#pragma unroll
  for (int g = 0; g < kHeads; ++g) {
    float mx = -INFINITY, sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, wm[w][g]);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += wm[w][g] == -INFINITY ? 0.f : wl[w][g] * exp2f(wm[w][g] - mx);
    f[g] = m[g] == -INFINITY ? 0.f : exp2f(m[g] - mx);  // a warp that had no key adds nothing
    if (threadIdx.x == 0) tot_l[g] = sum;
    if (threadIdx.x == g && p.parts > 1 && g < nh) p.part_ml[ml0 + int64_t(g) * p.parts] = make_float2(mx, sum);
  }
  float* buf = qsm;  // [kHeads][DP]
  for (int w = 0; w < kWarps; ++w) {
    if (warp == w)
#pragma unroll
      for (int g = 0; g < kHeads; ++g)
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

// Grid (num_tokens, Hq): out = sum over partitions of sum_p * 2^(max_p - max) * o_p, normalised.
template <class T>
__global__ void paged_combine_kernel(T* out, const float* part_o, const float2* part_ml, int Hq, int D, int parts,
                                     int64_t os) {
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

template <class F> void dispatch_dp(int64_t D, F&& f) {
  if (D <= 64) f(std::integral_constant<int, 64>{});
  else if (D <= 96) f(std::integral_constant<int, 96>{});
  else if (D <= 128) f(std::integral_constant<int, 128>{});
  else f(std::integral_constant<int, 256>{});
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
      kv_cache_write_kernel<T, VEC><<<blocks, 256, 0, s>>>(static_cast<T*>(k_cache), static_cast<T*>(v_cache),
                                                           static_cast<const T*>(k), static_cast<const T*>(v), N, W,
                                                           ks, vs, slots);
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
  p.head_slices = (p.group + kHeads - 1) / kHeads;
  p.log2_bs = std::countr_zero(uint64_t(block_size));
  p.scale_log2 = scale * kLog2e;

  // Split the context only when the unsplit grid leaves SMs idle; aim at about two blocks per SM.
  const int64_t pairs = num_tokens * Hkv * p.head_slices;
  const int64_t sms = sm_count();
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
    dispatch_dp(D, [&](auto dp) {
      constexpr int DP = decltype(dp)::value;
      dim3 grid(unsigned(num_tokens), unsigned(Hkv * p.head_slices), unsigned(p.parts));
      paged_attention_kernel<T, DP><<<grid, kThreads, 0, s>>>(static_cast<T*>(out), static_cast<const T*>(q),
                                                              static_cast<const T*>(k_cache),
                                                              static_cast<const T*>(v_cache), p);
    });
    ZP_CUDA_LAUNCH_CHECK();
    if (p.parts > 1)
      paged_combine_kernel<T><<<dim3(unsigned(num_tokens), unsigned(Hq)), 128, 0, s>>>(
          static_cast<T*>(out), p.part_o, p.part_ml, p.Hq, p.D, p.parts, os);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace zp::kernels::cuda
