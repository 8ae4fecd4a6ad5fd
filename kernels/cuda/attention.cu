// Attention without materialising the [Tq, Tk] score matrix: tiles of 32 keys stream through shared
// memory and the softmax is computed online (running max and sum, rescaling the accumulators when the
// max grows). Scores are kept in base 2: q is pre-multiplied by scale*log2(e) so exp2f does the
// exponentials, and lse is converted back to natural log on output.
//
// The layout trick that keeps shared memory free of bank conflicts: a warp computes 32 scores at
// once with lane = key (or query), so the operand indexed by the lane is stored transposed with a
// row pitch of 33 floats, while the other operand is read as float4 broadcasts. The same transposed
// tile is then read "down a column" (lane = head dimension) for the weighted sums, again conflict
// free because 33 is odd. D is padded with zeros to a multiple of 32 so every loop is fixed-length.
//
// Backward, with no atomics and no workspace: one kernel owns a tile of 32 keys (all query heads of
// its kv group) and loops over queries to accumulate dK and dV in registers; a second kernel owns a
// tile of 32 queries and loops over keys for dQ. Both recompute p = exp(s - lse) and
// delta_i = dout_i . out_i (cheap next to the tile products).
//
// Packed sequences (segments): a score is masked unless query and key share a segment id, and a whole
// tile pair is skipped, uniformly across the block, when the min/max id ranges of its 32 queries and 32
// keys do not overlap (every warp reduces the same 32 ids, so no shared memory or barrier is needed).
// With sorted ids (the packing order) that skips every tile pair outside the block diagonal.
//
// These kernels are the general path (f32, any head dim up to 256, any strides). bf16 / f16 with a head
// dim and strides the tensor-core kernels support go to kernels/cuda/flash_attention.cu instead.
#include <algorithm>
#include <climits>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/cuda/attention_segments.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/scratch.cuh"

namespace zp::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kTile = 32;                  // keys per tile (forward, dQ) = queries per tile (dK/dV)
constexpr int kPerWarp = kTile / kWarps;   // queries (forward, dQ) or keys (dK/dV) owned by each warp
constexpr int kPitch = kTile + 1;          // row pitch of transposed tiles
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kMaxDR = 8;                  // D <= 256

struct Dims {
  int B, Tq, Tk, Hq, Hkv, D, group;
  int64_t qs, ks, vs, os;  // row strides in elements
  float scale;
  bool causal;
  const int32_t* seg;  // [B, T] segment ids (Tq == Tk == T), or nullptr
  // Key j passes the range and causal rules for query i (segments are checked by the caller).
  __device__ bool visible(int i, int j) const {
    return i < Tq && j < Tk && (!causal || j <= i + (Tk - Tq));
  }
  // Segment id of token t < T of row b; 0 (never read) past the end.
  __device__ int segment(int b, int t) const { return t < Tq ? seg[int64_t(b) * Tq + t] : 0; }
};


// Rows [row0, row0 + kTile) x D of a strided [T, H*D] tensor (head offset included in `base`) into
// shared memory, zero-padded to DP columns and past T; `mul` is applied to every value.
// transposed: dst[d * kPitch + r], else dst[r * DP + d].
template <class T, int DP, bool TRANSPOSED>
__device__ __forceinline__ void load_tile(float* dst, const T* base, int64_t stride, int row0, int rows, int D,
                                          float mul) {
  for (int idx = threadIdx.x; idx < kTile * DP; idx += kThreads) {
    int r = idx / DP, d = idx % DP;
    float x = (row0 + r < rows && d < D) ? to_f(base[int64_t(row0 + r) * stride + d]) * mul : 0.f;
    if (TRANSPOSED) dst[d * kPitch + r] = x;
    else dst[r * DP + d] = x;
  }
}

// s[n] = sum_d rows[n][d] * cols[d][lane] for the kPerWarp rows of this warp (float4 broadcasts of
// `rows`, conflict-free reads of the transposed `cols`).
template <int DP>
__device__ __forceinline__ void tile_dots(float (&s)[kPerWarp], const float* rows, const float* cols, int lane) {
#pragma unroll
  for (int n = 0; n < kPerWarp; ++n) s[n] = 0.f;
#pragma unroll 4
  for (int d = 0; d < DP; d += 4) {
    float c0 = cols[(d + 0) * kPitch + lane], c1 = cols[(d + 1) * kPitch + lane];
    float c2 = cols[(d + 2) * kPitch + lane], c3 = cols[(d + 3) * kPitch + lane];
#pragma unroll
    for (int n = 0; n < kPerWarp; ++n) {
      float4 r = *reinterpret_cast<const float4*>(rows + n * DP + d);
      s[n] = fmaf(r.x, c0, fmaf(r.y, c1, fmaf(r.z, c2, fmaf(r.w, c3, s[n]))));
    }
  }
}

template <int DR>
constexpr size_t forward_smem_floats() { return size_t(kTile) * DR * 32 * 2 + size_t(DR) * 32 * kPitch; }
template <int DR>
constexpr size_t backward_smem_floats() { return size_t(kTile) * DR * 32 * 2 + size_t(DR) * 32 * kPitch * 2 + 2 * kTile; }

// Grid (query tiles, Hq, B). Warp w owns queries q0 + w*kPerWarp + n; lane = key for the scores,
// lane = head dimension (d = r*32 + lane) for the output accumulators.
template <class T, int DR>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(T* out, float* lse, const T* q, const T* k, const T* v, Dims p) {
  constexpr int DP = DR * 32;
  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);  // [kTile][DP], pre-scaled by scale*log2e
  float* Vs = Qs + kTile * DP;                  // [kTile][DP]
  float* Kt = Vs + kTile * DP;                  // [DP][kPitch]
  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kTile, hk = h / p.group;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  load_tile<T, DP, false>(Qs, q + int64_t(b) * p.Tq * p.qs + int64_t(h) * p.D, p.qs, q0, p.Tq, p.D,
                          p.scale * kLog2e);
  const T* kb = k + int64_t(b) * p.Tk * p.ks + int64_t(hk) * p.D;
  const T* vb = v + int64_t(b) * p.Tk * p.vs + int64_t(hk) * p.D;
  int kv_end = p.Tk;
  if (p.causal) kv_end = std::clamp(std::min(q0 + kTile, p.Tq) + (p.Tk - p.Tq), 0, p.Tk);

  float m[kPerWarp], l[kPerWarp], acc[kPerWarp][DR];
#pragma unroll
  for (int n = 0; n < kPerWarp; ++n) {
    m[n] = -INFINITY;
    l[n] = 0.f;
#pragma unroll
    for (int r = 0; r < DR; ++r) acc[n][r] = 0.f;
  }
  const float* my_q = Qs + warp * kPerWarp * DP;
  // Packed sequences: this warp's query ids and the id range of the block's query tile.
  int qseg[kPerWarp];
  SegRange q_range{0, 0};
  if (p.seg) {
#pragma unroll
    for (int n = 0; n < kPerWarp; ++n) qseg[n] = p.segment(b, q0 + warp * kPerWarp + n);
    q_range = warp_segment_range(p.segment(b, q0 + lane), q0 + lane < p.Tq);
  }

  for (int j0 = 0; j0 < kv_end; j0 += kTile) {
    int kseg = 0;  // segment of key j0 + lane
    if (p.seg) {
      kseg = p.segment(b, j0 + lane);
      // The same answer in every warp, so the whole block skips before the barrier.
      if (!q_range.overlaps(warp_segment_range(kseg, j0 + lane < p.Tk))) continue;
    }
    __syncthreads();  // the previous tile is consumed
    load_tile<T, DP, true>(Kt, kb, p.ks, j0, p.Tk, p.D, 1.f);
    load_tile<T, DP, false>(Vs, vb, p.vs, j0, p.Tk, p.D, 1.f);
    __syncthreads();

    float s[kPerWarp];
    tile_dots<DP>(s, my_q, Kt, lane);
#pragma unroll
    for (int n = 0; n < kPerWarp; ++n) {
      int i = q0 + warp * kPerWarp + n;
      if (!p.visible(i, j0 + lane) || (p.seg && qseg[n] != kseg)) s[n] = -INFINITY;
      float m_new = fmaxf(m[n], warp_max(s[n]));
      // m_new = -inf: nothing visible yet; keep everything at zero.
      float pj = m_new == -INFINITY ? 0.f : exp2f(s[n] - m_new);
      float alpha = m_new == -INFINITY ? 1.f : exp2f(m[n] - m_new);
      l[n] = l[n] * alpha + warp_sum(pj);
      m[n] = m_new;
      s[n] = pj;
#pragma unroll
      for (int r = 0; r < DR; ++r) acc[n][r] *= alpha;
    }
#pragma unroll 4
    for (int j = 0; j < kTile; ++j) {
      float pj[kPerWarp];
#pragma unroll
      for (int n = 0; n < kPerWarp; ++n) pj[n] = __shfl_sync(0xffffffffu, s[n], j);
#pragma unroll
      for (int r = 0; r < DR; ++r) {
        float vv = Vs[j * DP + r * 32 + lane];
#pragma unroll
        for (int n = 0; n < kPerWarp; ++n) acc[n][r] = fmaf(pj[n], vv, acc[n][r]);
      }
    }
  }

#pragma unroll
  for (int n = 0; n < kPerWarp; ++n) {
    int i = q0 + warp * kPerWarp + n;
    if (i >= p.Tq) continue;
    float inv = l[n] > 0.f ? 1.f / l[n] : 0.f;
    T* o = out + (int64_t(b) * p.Tq + i) * p.os + int64_t(h) * p.D;
#pragma unroll
    for (int r = 0; r < DR; ++r)
      if (r * 32 + lane < p.D) o[r * 32 + lane] = from_f<T>(acc[n][r] * inv);
    if (lane == 0) lse[(int64_t(b) * p.Hq + h) * p.Tq + i] = l[n] > 0.f ? (m[n] + log2f(l[n])) * kLn2 : -INFINITY;
  }
}

// delta = dout_i . out_i for query i of head h, by one warp (lanes over d); every lane gets it.
template <class T, int DR>
__device__ __forceinline__ float row_delta(const T* dout, const T* out, const Dims& p, int b, int h, int i,
                                           int lane) {
  float acc = 0.f;
  if (i < p.Tq) {
    int64_t off = (int64_t(b) * p.Tq + i) * p.os + int64_t(h) * p.D;
#pragma unroll
    for (int r = 0; r < DR; ++r)
      if (r * 32 + lane < p.D) acc += to_f(dout[off + r * 32 + lane]) * to_f(out[off + r * 32 + lane]);
  }
  return warp_sum(acc);
}

// Grid (query tiles, Hq, B). Warp w owns queries q0 + w*kPerWarp + n, as in the forward.
// ds_ij = p_ij (dout_i . v_j - delta_i); dq_i = scale * sum_j ds_ij k_j.
template <class T, int DR>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dq_kernel(T* dq, const T* dout, const T* q, const T* k, const T* v, const T* out,
                                 const float* lse, Dims p) {
  constexpr int DP = DR * 32;
  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);  // [kTile][DP], pre-scaled by scale*log2e
  float* dOs = Qs + kTile * DP;                 // [kTile][DP]
  float* Kt = dOs + kTile * DP;                 // [DP][kPitch]
  float* Vt = Kt + DP * kPitch;                 // [DP][kPitch]
  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kTile, hk = h / p.group;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  int64_t head_off = int64_t(h) * p.D;
  load_tile<T, DP, false>(Qs, q + int64_t(b) * p.Tq * p.qs + head_off, p.qs, q0, p.Tq, p.D, p.scale * kLog2e);
  load_tile<T, DP, false>(dOs, dout + int64_t(b) * p.Tq * p.os + head_off, p.os, q0, p.Tq, p.D, 1.f);
  const T* kb = k + int64_t(b) * p.Tk * p.ks + int64_t(hk) * p.D;
  const T* vb = v + int64_t(b) * p.Tk * p.vs + int64_t(hk) * p.D;
  int kv_end = p.Tk;
  if (p.causal) kv_end = std::clamp(std::min(q0 + kTile, p.Tq) + (p.Tk - p.Tq), 0, p.Tk);

  float lse2[kPerWarp], delta[kPerWarp], acc[kPerWarp][DR];
#pragma unroll
  for (int n = 0; n < kPerWarp; ++n) {
    int i = q0 + warp * kPerWarp + n;
    // Out-of-range queries get lse = +inf, so p = 0 (they are also masked by visible()).
    lse2[n] = i < p.Tq ? lse[(int64_t(b) * p.Hq + h) * p.Tq + i] * kLog2e : INFINITY;
    delta[n] = row_delta<T, DR>(dout, out, p, b, h, i, lane);
#pragma unroll
    for (int r = 0; r < DR; ++r) acc[n][r] = 0.f;
  }
  const float* my_q = Qs + warp * kPerWarp * DP;
  const float* my_do = dOs + warp * kPerWarp * DP;
  // Packed sequences, as in the forward.
  int qseg[kPerWarp];
  SegRange q_range{0, 0};
  if (p.seg) {
#pragma unroll
    for (int n = 0; n < kPerWarp; ++n) qseg[n] = p.segment(b, q0 + warp * kPerWarp + n);
    q_range = warp_segment_range(p.segment(b, q0 + lane), q0 + lane < p.Tq);
  }

  for (int j0 = 0; j0 < kv_end; j0 += kTile) {
    int kseg = 0;
    if (p.seg) {
      kseg = p.segment(b, j0 + lane);
      if (!q_range.overlaps(warp_segment_range(kseg, j0 + lane < p.Tk))) continue;
    }
    __syncthreads();
    load_tile<T, DP, true>(Kt, kb, p.ks, j0, p.Tk, p.D, 1.f);
    load_tile<T, DP, true>(Vt, vb, p.vs, j0, p.Tk, p.D, 1.f);
    __syncthreads();

    float s[kPerWarp], dp[kPerWarp];
    tile_dots<DP>(s, my_q, Kt, lane);
    tile_dots<DP>(dp, my_do, Vt, lane);
#pragma unroll
    for (int n = 0; n < kPerWarp; ++n) {
      int i = q0 + warp * kPerWarp + n;
      bool vis = p.visible(i, j0 + lane) && (!p.seg || qseg[n] == kseg);
      float pij = vis ? exp2f(s[n] - lse2[n]) : 0.f;
      s[n] = pij * (dp[n] - delta[n]);  // ds
    }
#pragma unroll 4
    for (int j = 0; j < kTile; ++j) {
      float ds[kPerWarp];
#pragma unroll
      for (int n = 0; n < kPerWarp; ++n) ds[n] = __shfl_sync(0xffffffffu, s[n], j);
#pragma unroll
      for (int r = 0; r < DR; ++r) {
        float kv = Kt[(r * 32 + lane) * kPitch + j];
#pragma unroll
        for (int n = 0; n < kPerWarp; ++n) acc[n][r] = fmaf(ds[n], kv, acc[n][r]);
      }
    }
  }

#pragma unroll
  for (int n = 0; n < kPerWarp; ++n) {
    int i = q0 + warp * kPerWarp + n;
    if (i >= p.Tq) continue;
    T* g = dq + (int64_t(b) * p.Tq + i) * p.qs + head_off;
#pragma unroll
    for (int r = 0; r < DR; ++r)
      if (r * 32 + lane < p.D) g[r * 32 + lane] = from_f<T>(acc[n][r] * p.scale);
  }
}

// Grid (key tiles, Hkv, B). Warp w owns keys j0 + w*kPerWarp + n; lane = query for the scores,
// lane = head dimension for the dK/dV accumulators. Loops over every query head of the kv group, so
// the sum over shared heads happens in registers.
// dv_j = sum_i p_ij dout_i; dk_j = scale * sum_i ds_ij q_i.
template <class T, int DR>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dkdv_kernel(T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                                   const float* lse, Dims p) {
  constexpr int DP = DR * 32;
  extern __shared__ float4 smem4[];
  float* Ks = reinterpret_cast<float*>(smem4);  // [kTile][DP], pre-scaled by scale*log2e
  float* Vs = Ks + kTile * DP;                  // [kTile][DP]
  float* Qt = Vs + kTile * DP;                  // [DP][kPitch]
  float* dOt = Qt + DP * kPitch;                // [DP][kPitch]
  float* lse_s = dOt + DP * kPitch;             // [kTile], base 2
  float* delta_s = lse_s + kTile;               // [kTile]
  const int b = blockIdx.z, hk = blockIdx.y, j0 = blockIdx.x * kTile;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  load_tile<T, DP, false>(Ks, k + int64_t(b) * p.Tk * p.ks + int64_t(hk) * p.D, p.ks, j0, p.Tk, p.D,
                          p.scale * kLog2e);
  load_tile<T, DP, false>(Vs, v + int64_t(b) * p.Tk * p.vs + int64_t(hk) * p.D, p.vs, j0, p.Tk, p.D, 1.f);
  // Queries before i_begin see none of this tile's keys.
  int i_begin = p.causal ? std::max(0, j0 - (p.Tk - p.Tq)) : 0;

  float gk[kPerWarp][DR], gv[kPerWarp][DR];
#pragma unroll
  for (int n = 0; n < kPerWarp; ++n)
#pragma unroll
    for (int r = 0; r < DR; ++r) gk[n][r] = gv[n][r] = 0.f;
  const float* my_k = Ks + warp * kPerWarp * DP;
  const float* my_v = Vs + warp * kPerWarp * DP;
  // Packed sequences: this warp's key ids and the id range of the block's key tile.
  int kseg[kPerWarp];
  SegRange k_range{0, 0};
  if (p.seg) {
#pragma unroll
    for (int n = 0; n < kPerWarp; ++n) kseg[n] = p.segment(b, j0 + warp * kPerWarp + n);
    k_range = warp_segment_range(p.segment(b, j0 + lane), j0 + lane < p.Tk);
  }

  for (int h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    int64_t head_off = int64_t(h) * p.D;
    for (int i0 = i_begin; i0 < p.Tq; i0 += kTile) {
      int qseg = 0;  // segment of query i0 + lane
      if (p.seg) {
        qseg = p.segment(b, i0 + lane);
        if (!k_range.overlaps(warp_segment_range(qseg, i0 + lane < p.Tq))) continue;  // uniform, as above
      }
      __syncthreads();
      load_tile<T, DP, true>(Qt, q + int64_t(b) * p.Tq * p.qs + head_off, p.qs, i0, p.Tq, p.D, 1.f);
      load_tile<T, DP, true>(dOt, dout + int64_t(b) * p.Tq * p.os + head_off, p.os, i0, p.Tq, p.D, 1.f);
#pragma unroll
      for (int n = 0; n < kPerWarp; ++n) {
        int r = warp * kPerWarp + n, i = i0 + r;
        float delta = row_delta<T, DR>(dout, out, p, b, h, i, lane);
        if (lane == 0) {
          delta_s[r] = delta;
          lse_s[r] = i < p.Tq ? lse[(int64_t(b) * p.Hq + h) * p.Tq + i] * kLog2e : INFINITY;
        }
      }
      __syncthreads();

      // Scores with the roles swapped: rows = this warp's keys, lane = query i0 + lane.
      float s[kPerWarp], dp[kPerWarp];
      tile_dots<DP>(s, my_k, Qt, lane);
      tile_dots<DP>(dp, my_v, dOt, lane);
      float lse_i = lse_s[lane], delta_i = delta_s[lane];
#pragma unroll
      for (int n = 0; n < kPerWarp; ++n) {
        bool vis = p.visible(i0 + lane, j0 + warp * kPerWarp + n) && (!p.seg || qseg == kseg[n]);
        float pij = vis ? exp2f(s[n] - lse_i) : 0.f;
        s[n] = pij;
        dp[n] = pij * (dp[n] - delta_i);  // ds
      }
#pragma unroll 4
      for (int i = 0; i < kTile; ++i) {
        float pi[kPerWarp], dsi[kPerWarp];
#pragma unroll
        for (int n = 0; n < kPerWarp; ++n) {
          pi[n] = __shfl_sync(0xffffffffu, s[n], i);
          dsi[n] = __shfl_sync(0xffffffffu, dp[n], i);
        }
#pragma unroll
        for (int r = 0; r < DR; ++r) {
          float qv = Qt[(r * 32 + lane) * kPitch + i], dov = dOt[(r * 32 + lane) * kPitch + i];
#pragma unroll
          for (int n = 0; n < kPerWarp; ++n) {
            gv[n][r] = fmaf(pi[n], dov, gv[n][r]);
            gk[n][r] = fmaf(dsi[n], qv, gk[n][r]);
          }
        }
      }
    }
  }

#pragma unroll
  for (int n = 0; n < kPerWarp; ++n) {
    int j = j0 + warp * kPerWarp + n;
    if (j >= p.Tk) continue;
    T* gkr = dk + (int64_t(b) * p.Tk + j) * p.ks + int64_t(hk) * p.D;
    T* gvr = dv + (int64_t(b) * p.Tk + j) * p.vs + int64_t(hk) * p.D;
#pragma unroll
    for (int r = 0; r < DR; ++r)
      if (r * 32 + lane < p.D) {
        gkr[r * 32 + lane] = from_f<T>(gk[n][r] * p.scale);
        gvr[r * 32 + lane] = from_f<T>(gv[n][r]);
      }
  }
}

Dims make_dims(int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D, int64_t qs, int64_t ks,
               int64_t vs, int64_t os, float scale, bool causal, const int32_t* segments) {
  ZP_CHECK(B >= 0 && Tq >= 0 && Tk >= 0 && Hq > 0 && Hkv > 0 && D > 0);
  ZP_CHECK(Hq % Hkv == 0, "Hq ", Hq, " is not a multiple of Hkv ", Hkv);
  check_segments_shape(segments, Tq, Tk);
  ZP_CHECK(D <= kMaxDR * 32, "attention head dim ", D, " > ", kMaxDR * 32);
  ZP_CHECK(B <= 65535 && Hq <= 65535 && Tq < (int64_t(1) << 30) && Tk < (int64_t(1) << 30));
  Dims p{int(B), int(Tq), int(Tk), int(Hq), int(Hkv), int(D), int(Hq / Hkv),
         qs ? qs : Hq * D, ks ? ks : Hkv * D, vs ? vs : Hkv * D, os ? os : Hq * D, scale, causal, segments};
  ZP_CHECK(p.qs >= Hq * D && p.os >= Hq * D && p.ks >= Hkv * D && p.vs >= Hkv * D, "row stride too small");
  return p;
}


// Calls fn(std::integral_constant<int, DR>) with DR = ceil(D / 32).
template <class Fn>
void dispatch_dr(int D, Fn&& fn) {
  switch ((D + 31) / 32) {
    case 1: fn(std::integral_constant<int, 1>{}); break;
    case 2: fn(std::integral_constant<int, 2>{}); break;
    case 3: fn(std::integral_constant<int, 3>{}); break;
    case 4: fn(std::integral_constant<int, 4>{}); break;
    case 5: fn(std::integral_constant<int, 5>{}); break;
    case 6: fn(std::integral_constant<int, 6>{}); break;
    case 7: fn(std::integral_constant<int, 7>{}); break;
    case 8: fn(std::integral_constant<int, 8>{}); break;
    default: ZP_FATAL("attention head dim ", D, " unsupported");
  }
}

// Head dims the flash kernels lack but that pad cheaply to one they have (16 and 32; SD 1.x's 40 the
// flash kernels take as it is): q, k, v (and out, dout for the backward) are copied into zero-padded
// 64-wide heads. Zero columns change no dot product and give zero output columns, so the result is
// exact; the copies cost O(T*D) against the attention's O(T^2*D).
constexpr int64_t kPaddedD = 64;

bool pads_to_flash(DType dt, int64_t D) {
  return D < kPaddedD && D % 8 == 0 && attention_uses_flash(dt, kPaddedD, 0, 0, 0, 0);
}

// dst[r, h, :Dp] = [src[r * stride + h * D + :D], 0...] for r < rows (tokens), h < H.
template <class T>
__global__ void pad_heads_kernel(T* __restrict__ dst, const T* __restrict__ src, int64_t rows, int64_t H, int64_t D,
                                 int64_t stride, int64_t Dp) {
  const int64_t n = rows * H * Dp;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % Dp, rh = i / Dp, h = rh % H, r = rh / H;
    dst[i] = d < D ? src[r * stride + h * D + d] : from_f<T>(0.f);
  }
}

// dst[r * stride + h * D + :D] = src[r, h, :D].
template <class T>
__global__ void unpad_heads_kernel(T* __restrict__ dst, const T* __restrict__ src, int64_t rows, int64_t H, int64_t D,
                                   int64_t stride, int64_t Dp) {
  const int64_t n = rows * H * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % D, rh = i / D, h = rh % H, r = rh / H;
    dst[r * stride + h * D + d] = src[(r * H + h) * Dp + d];
  }
}

unsigned pad_grid(int64_t n) { return unsigned(std::min<int64_t>((n + 255) / 256, 65535 * 8)); }

KernelScratch padded_scratch(StreamHandle s, DType dt, int64_t rows, int64_t H) {
  return KernelScratch(s, size_t(rows * H * kPaddedD) * dtype_size(dt), "attention padding");
}

KernelScratch padded_heads(StreamHandle s, DType dt, const void* src, int64_t rows, int64_t H, int64_t D,
                           int64_t stride) {
  KernelScratch t = padded_scratch(s, dt, rows, H);
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    pad_heads_kernel<<<pad_grid(rows * H * kPaddedD), 256, 0, s>>>(t.as<T>(), static_cast<const T*>(src), rows, H, D,
                                                                   stride, kPaddedD);
  });
  ZP_CUDA_LAUNCH_CHECK();
  return t;
}

void unpad_heads(StreamHandle s, DType dt, void* dst, const KernelScratch& src, int64_t rows, int64_t H, int64_t D,
                 int64_t stride) {
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    unpad_heads_kernel<<<pad_grid(rows * H * D), 256, 0, s>>>(static_cast<T*>(dst), src.as<const T>(),
                                                              rows, H, D, stride, kPaddedD);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace

void attention_forward(StreamHandle s, DType dt, void* out, float* lse, const void* q, const void* k, const void* v,
                       int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D, int64_t q_stride,
                       int64_t k_stride, int64_t v_stride, int64_t o_stride, float scale, bool causal,
                       const int32_t* segments) {
  Dims p = make_dims(B, Tq, Tk, Hq, Hkv, D, q_stride, k_stride, v_stride, o_stride, scale, causal, segments);
  if (B == 0 || Tq == 0) return;
  // The flash kernels track the running max on unscaled scores, hence scale > 0.
  if (scale > 0.f && attention_uses_flash(dt, D, p.qs, p.ks, p.vs, p.os) && flash_attention_aligned({out, q, k, v})) {
    flash_attention_forward(s, dt, out, lse, q, k, v, B, Tq, Tk, Hq, Hkv, D, p.qs, p.ks, p.vs, p.os, scale, causal,
                            segments);
    return;
  }
  if (scale > 0.f && pads_to_flash(dt, D)) {
    const int64_t P = kPaddedD;
    KernelScratch qp = padded_heads(s, dt, q, B * Tq, Hq, D, p.qs), kp = padded_heads(s, dt, k, B * Tk, Hkv, D, p.ks);
    KernelScratch vp = padded_heads(s, dt, v, B * Tk, Hkv, D, p.vs), op = padded_scratch(s, dt, B * Tq, Hq);
    flash_attention_forward(s, dt, op.get(), lse, qp.get(), kp.get(), vp.get(), B, Tq, Tk, Hq, Hkv, P, Hq * P,
                            Hkv * P, Hkv * P, Hq * P, scale, causal, segments);
    unpad_heads(s, dt, out, op, B * Tq, Hq, D, p.os);
    return;
  }
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    dispatch_dr(p.D, [&](auto dr) {
      constexpr int DR = decltype(dr)::value;
      auto kernel = attention_forward_kernel<T, DR>;
      size_t bytes = forward_smem_floats<DR>() * sizeof(float);
      allow_dynamic_smem(kernel, bytes, "attention");
      dim3 grid(ceil_div(Tq, kTile), unsigned(Hq), unsigned(B));
      kernel<<<grid, kThreads, bytes, s>>>(static_cast<T*>(out), lse, static_cast<const T*>(q),
                                           static_cast<const T*>(k), static_cast<const T*>(v), p);
    });
  });
  ZP_CUDA_LAUNCH_CHECK();
}

void attention_backward(StreamHandle s, DType dt, void* dq, void* dk, void* dv, const void* dout, const void* q,
                        const void* k, const void* v, const void* out, const float* lse, int64_t B, int64_t Tq,
                        int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D, int64_t q_stride, int64_t k_stride,
                        int64_t v_stride, int64_t o_stride, float scale, bool causal, const int32_t* segments) {
  Dims p = make_dims(B, Tq, Tk, Hq, Hkv, D, q_stride, k_stride, v_stride, o_stride, scale, causal, segments);
  if (B == 0) return;
  if (scale > 0.f && attention_uses_flash(dt, D, p.qs, p.ks, p.vs, p.os) &&
      flash_attention_aligned({dq, dk, dv, dout, q, k, v, out})) {
    flash_attention_backward(s, dt, dq, dk, dv, dout, q, k, v, out, lse, B, Tq, Tk, Hq, Hkv, D, p.qs, p.ks, p.vs,
                             p.os, scale, causal, segments);
    return;
  }
  if (scale > 0.f && Tq > 0 && pads_to_flash(dt, D)) {
    const int64_t P = kPaddedD;
    KernelScratch qp = padded_heads(s, dt, q, B * Tq, Hq, D, p.qs), kp = padded_heads(s, dt, k, B * Tk, Hkv, D, p.ks);
    KernelScratch vp = padded_heads(s, dt, v, B * Tk, Hkv, D, p.vs);
    KernelScratch op = padded_heads(s, dt, out, B * Tq, Hq, D, p.os);
    KernelScratch dop = padded_heads(s, dt, dout, B * Tq, Hq, D, p.os);
    KernelScratch dqp = padded_scratch(s, dt, B * Tq, Hq), dkp = padded_scratch(s, dt, B * Tk, Hkv);
    KernelScratch dvp = padded_scratch(s, dt, B * Tk, Hkv);
    flash_attention_backward(s, dt, dqp.get(), dkp.get(), dvp.get(), dop.get(), qp.get(), kp.get(), vp.get(),
                             op.get(), lse, B, Tq, Tk, Hq, Hkv, P, Hq * P, Hkv * P, Hkv * P, Hq * P, scale, causal,
                             segments);
    unpad_heads(s, dt, dq, dqp, B * Tq, Hq, D, p.qs);
    unpad_heads(s, dt, dk, dkp, B * Tk, Hkv, D, p.ks);
    unpad_heads(s, dt, dv, dvp, B * Tk, Hkv, D, p.vs);
    return;
  }
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    dispatch_dr(p.D, [&](auto dr) {
      constexpr int DR = decltype(dr)::value;
      size_t bytes = backward_smem_floats<DR>() * sizeof(float);
      auto* pdout = static_cast<const T*>(dout);
      auto* pq = static_cast<const T*>(q);
      auto* pk = static_cast<const T*>(k);
      auto* pv = static_cast<const T*>(v);
      auto* pout = static_cast<const T*>(out);
      if (Tq > 0) {
        auto kernel = attention_backward_dq_kernel<T, DR>;
        allow_dynamic_smem(kernel, bytes, "attention");
        dim3 grid(ceil_div(Tq, kTile), unsigned(Hq), unsigned(B));
        kernel<<<grid, kThreads, bytes, s>>>(static_cast<T*>(dq), pdout, pq, pk, pv, pout, lse, p);
      }
      if (Tk > 0) {
        auto kernel = attention_backward_dkdv_kernel<T, DR>;
        allow_dynamic_smem(kernel, bytes, "attention");
        dim3 grid(ceil_div(Tk, kTile), unsigned(Hkv), unsigned(B));
        kernel<<<grid, kThreads, bytes, s>>>(static_cast<T*>(dk), static_cast<T*>(dv), pdout, pq, pk, pv, pout,
                                             lse, p);
      }
    });
  });
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace zp::kernels::cuda
