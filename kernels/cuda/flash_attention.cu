// FlashAttention-2 on tensor cores (sm_80+) for bf16 / f16 and head dims 40, 64, 80, 128 and 160: warp-level
// mma.sync m16n8k16 with fp32 accumulators, ldmatrix from shared memory, cp.async double buffering of
// the streamed tiles. Layout, masking, GQA and results are those of kernels/attention.h.
//
// The trick everything leans on: the accumulator fragment mma.sync leaves for a 16x16 score tile (two
// 16x8 tiles) holds, register pair by register pair, exactly the A-operand fragment of the next
// product. So P (forward) and P^T, dS^T (backward) go from accumulators to operands with a bf16/f16
// pack and no trip through shared memory; each warp owns 16 rows of the tile being reduced (queries in
// the forward, keys in the backward) and only dS crosses warps, through shared memory, for dQ.
//
// Shared-memory rows are D + 8 elements long: an odd number of 16-byte chunks, so the eight row
// addresses of every ldmatrix phase fall in eight distinct bank groups without any swizzle.
//
// A head dim that is not a multiple of 16 (SD 1.x's 40) computes as the next one (48): the tiles'
// loads fill the extra columns of shared memory with zeros, which change no dot product, and the
// stores write only the head's own columns, so no padded copy of the tensors is made.
//
// Forward: a CTA owns 16 * kWarps query rows of one (b, head) and streams key/value tiles; the online
// softmax keeps the running max on raw scores and exponentiates with one FFMA + ex2 (scores times
// scale * log2 e, hence scale > 0). Backward: a small kernel computes delta = rowsum(dO * O), the
// base-2 lse and zeroes an fp32 dQ accumulator (stream-ordered scratch, freed after the last launch);
// the main kernel owns 16 * kWarps keys of one (b, kv head), loops over every query tile of every
// query head sharing that kv head (dK, dV stay in registers, no atomics) and adds its dQ contribution
// with fp32 atomics; a last kernel scales dQ and converts it to the storage type.
//
// Packed sequences (segments) are a template flag, so the kernels without them are unchanged. With
// them, a CTA walks only the streamed tiles whose segment-id range (min, max) overlaps that of its own
// tile: a warp-wide min/max over the tile's ids, the same in every warp, so the choice is uniform and
// the double buffering simply prefetches the next tile that qualifies. Inside a visited tile, scores
// are masked elementwise unless both tiles hold one and the same id (the common interior case).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/attention.h"
#include "kernels/cuda/attention_segments.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/scratch.cuh"

namespace zp::kernels::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Rows [row0, row0 + ROWS) x DM columns of a strided tensor (`base` points at row 0 of this head) into
// shared memory with row pitch D + 8; rows at or past `rows`, and columns DM..D-1, are zero-filled.
template <class T, int D, int ROWS, int THREADS, int DM = D>
__device__ __forceinline__ void load_rows_async(T* dst, const T* base, int64_t stride, int row0, int rows) {
  constexpr int kChunks = D / 8, kTotal = ROWS * kChunks;
#pragma unroll
  for (int i = 0; i < (kTotal + THREADS - 1) / THREADS; ++i) {
    int c = int(threadIdx.x) + i * THREADS;
    if (kTotal % THREADS == 0 || c < kTotal) {
      int r = c / kChunks, ch = c % kChunks;
      bool ok = row0 + r < rows && (DM == D || ch < DM / 8);
      const T* src = ok ? base + int64_t(row0 + r) * stride + ch * 8 : base;
      cp_async_16(dst + r * (D + 8) + ch * 8, src, ok);
    }
  }
}

struct Shape {
  int Tq, Tk, Hq, Hkv, group;
  int64_t qs, ks, vs, os;  // row strides in elements
  float scale, scale_log2;
  bool causal;
  const int32_t* seg;  // [B, T] segment ids (Tq == Tk == T), or nullptr
};

// ---------------------------------------------------------------------------------------------
// Forward

// Forward tiling: head dim computed, warps per CTA, 16-row tiles per warp (a warp reuses every K / V
// fragment it loads for all of them), keys per streamed tile, CTAs per SM to aim for, whether each
// warp keeps its Q fragments in registers for the whole key loop, and the head dim in memory.
template <int HEAD_DIM, int WARPS, int ROW_TILES, int BLOCK_N, int MIN_BLOCKS, bool Q_IN_REGS, int MEM_DIM = HEAD_DIM>
struct FwdTile {
  static constexpr int D = HEAD_DIM, DM = MEM_DIM, kWarps = WARPS, kRowTiles = ROW_TILES, kBlockN = BLOCK_N;
  static constexpr int kMinBlocks = MIN_BLOCKS, kBlockM = 16 * ROW_TILES * WARPS;
  static constexpr bool kQInRegs = Q_IN_REGS;
  static constexpr size_t smem_bytes() { return size_t(kBlockM + 4 * kBlockN) * (D + 8) * 2; }
};
// Picked among a few candidates on an H100 (B=32 T=1024 H=12 D=64 and B=16 T=1024 H=16 D=128, causal
// and not): two row tiles per warp beat one by ~15%; 4 warps with 2 CTAs per SM beat 8 warps with 1.
template <int D> struct FwdTileFor;
template <> struct FwdTileFor<40> { using type = FwdTile<48, 4, 2, 64, 2, true, 40>; };
template <> struct FwdTileFor<64> { using type = FwdTile<64, 4, 2, 64, 2, true>; };
template <> struct FwdTileFor<80> { using type = FwdTile<80, 4, 2, 64, 2, false>; };
template <> struct FwdTileFor<128> { using type = FwdTile<128, 4, 2, 32, 2, false>; };
// SD 1.x's deepest blocks: one row tile per warp keeps a warp's 16 x 160 output in registers.
template <> struct FwdTileFor<160> { using type = FwdTile<160, 4, 1, 32, 2, false>; };

// A one-dimensional grid of B * Hq x query tiles, the tiles of one (b, head) consecutive: the CTAs
// resident at once then share a few heads' keys and values in L2 instead of each reading another
// head's from DRAM (with the heads fastest, the GPT-2 shape's forward read 517 MB from an H200's DRAM
// for 100 MB of q, k, v and out). Within a head the query tiles run in reverse, so that under causal
// masking the longest start first.
template <class T, class Tile, bool SEG>
__global__ void __launch_bounds__(Tile::kWarps * 32, Tile::kMinBlocks)
    flash_forward_kernel(T* out, float* lse, const T* q, const T* k, const T* v, Shape p) {
  constexpr int D = Tile::D, DM = Tile::DM, kRT = Tile::kRowTiles;
  constexpr int kWarps = Tile::kWarps, kThreads = kWarps * 32, kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN;
  constexpr int kPitch = D + 8, kKT = D / 16, kNT = kBlockN / 8, kDT = D / 8, kWarpRows = 16 * kRT;
  static_assert(D % 16 == 0 && kBlockN % 16 == 0);
  extern __shared__ __align__(16) unsigned char smem[];
  T* Qs = reinterpret_cast<T*>(smem);  // [kBlockM][kPitch]; reused for the output tile
  T* Ks = Qs + kBlockM * kPitch;       // [2][kBlockN][kPitch]
  T* Vs = Ks + 2 * kBlockN * kPitch;   // [2][kBlockN][kPitch]

  const int q_tiles = (p.Tq + kBlockM - 1) / kBlockM;
  const int64_t bh = int64_t(blockIdx.x) / q_tiles;
  const int q0 = (q_tiles - 1 - int(int64_t(blockIdx.x) % q_tiles)) * kBlockM;
  const int h = int(bh % p.Hq), b = int(bh / p.Hq), hk = h / p.group;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const LaneOffsets lo(lane);
  const int off = p.Tk - p.Tq;  // causal: key j is visible to query i iff j <= i + off
  const T* qb = q + int64_t(b) * p.Tq * p.qs + int64_t(h) * DM;
  const T* kb = k + int64_t(b) * p.Tk * p.ks + int64_t(hk) * DM;
  const T* vb = v + int64_t(b) * p.Tk * p.vs + int64_t(hk) * DM;

  const int n_end = p.causal ? min(p.Tk, min(q0 + kBlockM, p.Tq) + off) : p.Tk;
  const int n_blocks = n_end > 0 ? (n_end + kBlockN - 1) / kBlockN : 0;
  const int warp_row0 = q0 + warp * kWarpRows;  // row tile mt: rows warp_row0 + 16 mt + g (+ 8)

  // Packed sequences: the id ranges of the CTA's and of this warp's query rows, this thread's row ids,
  // and the first key tile (from nb on) whose range overlaps the CTA's, with its range in k_range.
  const int32_t* seg_b = SEG ? p.seg + int64_t(b) * p.Tq : nullptr;
  SegRange cta_range{0, 0}, warp_range{0, 0}, k_range{0, 0};
  int row_seg[kRT][2];
  if constexpr (SEG) {
    cta_range = warp_segment_range<kBlockM>(seg_b, q0, p.Tq, lane);
    warp_range = warp_segment_range<kWarpRows>(seg_b, warp_row0, p.Tq, lane);
#pragma unroll
    for (int mt = 0; mt < kRT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = warp_row0 + mt * 16 + g + 8 * r;
        row_seg[mt][r] = row < p.Tq ? seg_b[row] : 0;  // rows past Tq are never written
      }
  }
  auto next_block = [&](int nb) {
    if constexpr (SEG) {
      for (; nb < n_blocks; ++nb) {
        k_range = warp_segment_range<kBlockN>(seg_b, nb * kBlockN, p.Tk, lane);
        if (k_range.overlaps(cta_range)) break;
      }
    }
    return nb;
  };

  int nb = next_block(0);
  load_rows_async<T, D, kBlockM, kThreads, DM>(Qs, qb, p.qs, q0, p.Tq);
  if (nb < n_blocks) {
    load_rows_async<T, D, kBlockN, kThreads, DM>(Ks, kb, p.ks, nb * kBlockN, p.Tk);
    load_rows_async<T, D, kBlockN, kThreads, DM>(Vs, vb, p.vs, nb * kBlockN, p.Tk);
  }
  cp_async_commit();

  float o[kRT][kDT][4];
#pragma unroll
  for (int mt = 0; mt < kRT; ++mt)
#pragma unroll
    for (int i = 0; i < kDT; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
  float m[kRT][2], l[kRT][2];  // raw-score running max; this thread's partial row sums
#pragma unroll
  for (int mt = 0; mt < kRT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;
  uint32_t qf[kRT][Tile::kQInRegs ? kKT : 1][4];
  const T* q_warp = Qs + warp * kWarpRows * kPitch;

  // it counts visited tiles (it = nb without segments).
  for (int it = 0; nb < n_blocks; ++it) {
    const int buf = it & 1, j0 = nb * kBlockN;
    const SegRange tile_range = k_range;
    const int nb_next = next_block(nb + 1);
    next_tile_async(nb_next < n_blocks, [&] {
      load_rows_async<T, D, kBlockN, kThreads, DM>(Ks + (buf ^ 1) * kBlockN * kPitch, kb, p.ks, nb_next * kBlockN,
                                                   p.Tk);
      load_rows_async<T, D, kBlockN, kThreads, DM>(Vs + (buf ^ 1) * kBlockN * kPitch, vb, p.vs, nb_next * kBlockN,
                                                   p.Tk);
    });
    nb = nb_next;
    if constexpr (Tile::kQInRegs) {
      if (it == 0) {
#pragma unroll
        for (int mt = 0; mt < kRT; ++mt)
#pragma unroll
          for (int kk = 0; kk < kKT; ++kk)
            ldsm_x4(qf[mt][kk], q_warp + (mt * 16 + lo.a_row) * kPitch + kk * 16 + lo.a_col);
      }
    }
    // A warp whose rows all lie above the tile's first key, or (segments) share no id with it, has nothing
    // to add (exactly: p = 0, alpha = 1).
    bool warp_sees_tile = !p.causal || j0 <= warp_row0 + kWarpRows - 1 + off;
    bool seg_mask = false;  // some score of this warp and tile needs the elementwise segment mask
    if constexpr (SEG) {
      warp_sees_tile = warp_sees_tile && warp_range.overlaps(tile_range);
      seg_mask = !warp_range.same_single(tile_range);
    }
    if (warp_sees_tile) {
      const T* Kb = Ks + buf * kBlockN * kPitch;
      const T* Vb = Vs + buf * kBlockN * kPitch;

      // S = Q K^T for this warp's rows and the tile's kBlockN keys.
      float s[kRT][kNT][4];
#pragma unroll
      for (int mt = 0; mt < kRT; ++mt)
#pragma unroll
        for (int i = 0; i < kNT; ++i) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kKT; ++kk) {
        uint32_t a[kRT][4];
#pragma unroll
        for (int mt = 0; mt < kRT; ++mt) {
          if constexpr (Tile::kQInRegs) {
#pragma unroll
            for (int r = 0; r < 4; ++r) a[mt][r] = qf[mt][kk][r];
          } else {
            ldsm_x4(a[mt], q_warp + (mt * 16 + lo.a_row) * kPitch + kk * 16 + lo.a_col);
          }
        }
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          uint32_t bb[4];
          ldsm_x4(bb, Kb + (np * 16 + lo.b_row) * kPitch + kk * 16 + lo.b_col);
#pragma unroll
          for (int mt = 0; mt < kRT; ++mt) {
            mma_16816<T>(s[mt][2 * np], a[mt], bb[0], bb[1]);
            mma_16816<T>(s[mt][2 * np + 1], a[mt], bb[2], bb[3]);
          }
        }
      }

      // Mask keys past Tk, (causal) above the diagonal and (segments) of another segment; only tiles that
      // touch one of those need it.
      if (j0 + kBlockN > p.Tk || (p.causal && j0 + kBlockN - 1 > warp_row0 + off) || seg_mask) {
#pragma unroll
        for (int mt = 0; mt < kRT; ++mt)
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              int col = j0 + nt * 8 + 2 * t + (e & 1), row = warp_row0 + mt * 16 + g + (e >> 1) * 8;
              bool masked = col >= p.Tk || (p.causal && col > row + off);
              if constexpr (SEG) masked = masked || (seg_mask && seg_b[col] != row_seg[mt][e >> 1]);
              if (masked) s[mt][nt][e] = -INFINITY;
            }
      }

      // Online softmax; each row's 4 threads (a quad) combine their maxima with two shuffles.
#pragma unroll
      for (int mt = 0; mt < kRT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float mx = m[mt][r];
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          // Nothing visible yet (mx = -inf): every exponential below must come out 0, not NaN.
          const float base = mx == -INFINITY ? 0.f : mx * p.scale_log2;
          const float alpha = fast_exp2(m[mt][r] * p.scale_log2 - base);
          m[mt][r] = mx;
          float sum = 0.f;
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
            s[mt][nt][2 * r] = fast_exp2(fmaf(s[mt][nt][2 * r], p.scale_log2, -base));
            s[mt][nt][2 * r + 1] = fast_exp2(fmaf(s[mt][nt][2 * r + 1], p.scale_log2, -base));
            sum += s[mt][nt][2 * r] + s[mt][nt][2 * r + 1];
          }
          l[mt][r] = l[mt][r] * alpha + sum;
#pragma unroll
          for (int dt = 0; dt < kDT; ++dt) {
            o[mt][dt][2 * r] *= alpha;
            o[mt][dt][2 * r + 1] *= alpha;
          }
        }

      // O += P V, P straight from the score accumulators.
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        uint32_t a[kRT][4];
#pragma unroll
        for (int mt = 0; mt < kRT; ++mt) acc_to_a<T>(a[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
        for (int dp = 0; dp < kDT / 2; ++dp) {
          uint32_t bb[4];
          ldsm_x4_t(bb, Vb + (kk * 16 + lo.a_row) * kPitch + dp * 16 + lo.a_col);
#pragma unroll
          for (int mt = 0; mt < kRT; ++mt) {
            mma_16816<T>(o[mt][2 * dp], a[mt], bb[0], bb[1]);
            mma_16816<T>(o[mt][2 * dp + 1], a[mt], bb[2], bb[3]);
          }
        }
      }
    }
    __syncthreads();  // this buffer is refilled by the next iteration's prefetch
  }

  // Q may still be in flight when no key tile was visible.
  cp_async_wait<0>();
  __syncthreads();
  // Stage this warp's output rows over its own Q rows, then write them out 16 bytes at a time.
  T* o_warp = Qs + warp * kWarpRows * kPitch;
  float* lse_bh = lse + (int64_t(b) * p.Hq + h) * p.Tq;
#pragma unroll
  for (int mt = 0; mt < kRT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = l[mt][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      const int rr = mt * 16 + g + 8 * r;
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt)
        *reinterpret_cast<uint32_t*>(o_warp + rr * kPitch + dt * 8 + 2 * t) =
            pack2<T>(o[mt][dt][2 * r] * inv, o[mt][dt][2 * r + 1] * inv);
      const int row = warp_row0 + rr;
      if (t == 0 && row < p.Tq)
        lse_bh[row] = sum > 0.f ? (m[mt][r] * p.scale_log2 + log2f(sum)) * kLn2 : -INFINITY;
    }
  __syncwarp();
  T* ob = out + int64_t(b) * p.Tq * p.os + int64_t(h) * DM;
  constexpr int kDMT = DM / 8;  // 16-byte chunks of a row in memory
#pragma unroll
  for (int c = lane; c < kWarpRows * kDMT; c += 32) {
    int rr = c / kDMT, ch = c % kDMT, row = warp_row0 + rr;
    if (row < p.Tq)
      *reinterpret_cast<uint4*>(ob + int64_t(row) * p.os + ch * 8) =
          *reinterpret_cast<const uint4*>(o_warp + rr * kPitch + ch * 8);
  }
}

// ---------------------------------------------------------------------------------------------
// Backward

// Backward tiling: head dim computed, warps per CTA (16 keys each), queries per streamed tile, CTAs per
// SM to aim for, whether each warp keeps its K and V fragments in registers for the whole query loop,
// and the head dim in memory.
template <int HEAD_DIM, int WARPS, int BLOCK_M, int MIN_BLOCKS, bool KV_IN_REGS, int MEM_DIM = HEAD_DIM>
struct BwdTile {
  static constexpr int D = HEAD_DIM, DM = MEM_DIM, kWarps = WARPS, kBlockM = BLOCK_M, kMinBlocks = MIN_BLOCKS;
  static constexpr bool kKVInRegs = KV_IN_REGS;
  static constexpr size_t smem_bytes() {
    return size_t(2 * 16 * kWarps + 4 * kBlockM) * (D + 8) * 2  // K, V, 2 x (Q, dO)
           + size_t(16 * kWarps) * (kBlockM + 8) * 2             // dS^T
           + size_t(4 * kBlockM) * sizeof(float);                // 2 x (lse2, delta)
  }
};
// Picked on an H100 like the forward tiles: 8 warps (128 keys) per CTA beat 4 warps by ~30%.
template <int D> struct BwdTileFor;
template <> struct BwdTileFor<40> { using type = BwdTile<48, 8, 64, 1, true, 40>; };
template <> struct BwdTileFor<64> { using type = BwdTile<64, 8, 64, 1, true>; };
template <> struct BwdTileFor<80> { using type = BwdTile<80, 8, 64, 1, false>; };
template <> struct BwdTileFor<128> { using type = BwdTile<128, 8, 64, 1, false>; };
// 160: a warp's dK and dV rows take 160 registers, so query tiles of 32 keep the scores' small.
template <> struct BwdTileFor<160> { using type = BwdTile<160, 8, 32, 1, false>; };

// lse2 and delta are padded per (b, head) to a multiple of this, so query tiles never read past them.
constexpr int kRowPad = 128;

// One group of 8 lanes per query row (b, h, i), i < Tq_pad: delta = dO . O over the DM columns of a
// head in memory, lse2 = lse * log2 e (+inf where the row saw no key, or is padding: its probabilities
// come out 0), dq_acc row (D wide, the head dim computed) = 0.
template <class T>
__global__ void flash_backward_prep_kernel(float* delta, float* lse2, float* dq_acc, const T* dout, const T* out,
                                           const float* lse, Shape p, int DM, int D, int Tq_pad, int64_t rows) {
  int64_t row = int64_t(blockIdx.x) * (blockDim.x / 8) + threadIdx.x / 8;
  const int sub = threadIdx.x & 7;
  if (row >= rows) return;  // rows is a multiple of kRowPad: whole warps leave together
  const int64_t bh = row / Tq_pad;
  const int i = int(row % Tq_pad);
  const int b = int(bh / p.Hq), h = int(bh % p.Hq);
  float acc = 0.f;
  if (i < p.Tq) {
    int64_t o_off = (int64_t(b) * p.Tq + i) * p.os + int64_t(h) * DM;
    for (int c = sub; c < DM / 8; c += 8) {
      uint4 dv = *reinterpret_cast<const uint4*>(dout + o_off + c * 8);
      uint4 ov = *reinterpret_cast<const uint4*>(out + o_off + c * 8);
      const T* d8 = reinterpret_cast<const T*>(&dv);
      const T* o8 = reinterpret_cast<const T*>(&ov);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc = fmaf(to_f(d8[e]), to_f(o8[e]), acc);
    }
    float4* z = reinterpret_cast<float4*>(dq_acc + (bh * p.Tq + i) * D);
    for (int c = sub; c < D / 4; c += 8) z[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  acc += __shfl_xor_sync(0xffffffffu, acc, 4);
  acc += __shfl_xor_sync(0xffffffffu, acc, 2);
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  if (sub == 0) {
    delta[row] = acc;
    float l = i < p.Tq ? lse[bh * p.Tq + i] : -INFINITY;
    lse2[row] = l == -INFINITY ? INFINITY : l * kLog2e;
  }
}

// A one-dimensional grid of B * Hkv x key tiles, the tiles of one (b, kv head) consecutive, as in the
// forward: the resident CTAs share their heads' queries, output gradients and dQ accumulator rows in
// L2. Under causal masking a head's first key tiles see the most queries, and start first.
template <class T, class Tile, bool SEG>
__global__ void __launch_bounds__(Tile::kWarps * 32, Tile::kMinBlocks)
    flash_backward_kernel(T* dk, T* dv, float* dq_acc, const T* dout, const T* q, const T* k, const T* v,
                          const float* lse2, const float* delta, Shape p, int Tq_pad) {
  constexpr int D = Tile::D, DM = Tile::DM;
  constexpr int kWarps = Tile::kWarps, kThreads = kWarps * 32, kBlockN = 16 * kWarps, kBlockM = Tile::kBlockM;
  constexpr int kPitch = D + 8, kSPitch = kBlockM + 8, kKT = D / 16, kMT = kBlockM / 8, kDT = D / 8;
  // dQ tile [kBlockM][D]: warps split it into kRowTiles x kColGroups blocks of 16 x kCols.
  constexpr int kRowTiles = kBlockM / 16, kColGroups = kWarps / kRowTiles, kCols = D / kColGroups, kCT = kCols / 8;
  static_assert(D % 16 == 0 && kBlockM % 16 == 0 && kRowPad % kBlockM == 0);
  static_assert(kWarps % kRowTiles == 0 && D % kColGroups == 0 && kCols % 8 == 0);
  extern __shared__ __align__(16) unsigned char smem[];
  T* Ks = reinterpret_cast<T*>(smem);   // [kBlockN][kPitch]; dK staging at the end
  T* Vs = Ks + kBlockN * kPitch;        // [kBlockN][kPitch]; dV staging at the end
  T* Qs = Vs + kBlockN * kPitch;        // [2][kBlockM][kPitch]
  T* dOs = Qs + 2 * kBlockM * kPitch;   // [2][kBlockM][kPitch]
  T* dSs = dOs + 2 * kBlockM * kPitch;  // [kBlockN][kSPitch]: dS^T of the current tile
  float* lse_s = reinterpret_cast<float*>(dSs + kBlockN * kSPitch);  // [2][kBlockM]
  float* delta_s = lse_s + 2 * kBlockM;                               // [2][kBlockM]

  const int k_tiles = (p.Tk + kBlockN - 1) / kBlockN;
  const int64_t bh = int64_t(blockIdx.x) / k_tiles;
  const int j0 = int(int64_t(blockIdx.x) % k_tiles) * kBlockN, hk = int(bh % p.Hkv), b = int(bh / p.Hkv);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const LaneOffsets lo(lane);
  const int off = p.Tk - p.Tq;
  // Causal: queries before j0 - off see none of this tile's keys.
  const int m_begin = p.causal ? max(0, j0 - off) / kBlockM * kBlockM : 0;
  const int m_tiles = p.Tq > m_begin ? (p.Tq - m_begin + kBlockM - 1) / kBlockM : 0;
  const int n_iters = m_tiles * p.group;

  load_rows_async<T, D, kBlockN, kThreads, DM>(Ks, k + int64_t(b) * p.Tk * p.ks + int64_t(hk) * DM, p.ks, j0, p.Tk);
  load_rows_async<T, D, kBlockN, kThreads, DM>(Vs, v + int64_t(b) * p.Tk * p.vs + int64_t(hk) * DM, p.vs, j0, p.Tk);
  // Query tile `it`: head h = hk * group + it / m_tiles, rows i0 = m_begin + (it % m_tiles) * kBlockM.
  auto load_query_tile = [&](int it, int buf) {
    const int h = hk * p.group + it / m_tiles, i0 = m_begin + (it % m_tiles) * kBlockM;
    load_rows_async<T, D, kBlockM, kThreads, DM>(Qs + buf * kBlockM * kPitch,
                                                 q + int64_t(b) * p.Tq * p.qs + int64_t(h) * DM, p.qs, i0, p.Tq);
    load_rows_async<T, D, kBlockM, kThreads, DM>(dOs + buf * kBlockM * kPitch,
                                                 dout + int64_t(b) * p.Tq * p.os + int64_t(h) * DM, p.os, i0, p.Tq);
    const int64_t row = (int64_t(b) * p.Hq + h) * Tq_pad + i0;
    if (int(threadIdx.x) < kBlockM / 4)
      cp_async_16(lse_s + buf * kBlockM + threadIdx.x * 4, lse2 + row + threadIdx.x * 4, true);
    else if (int(threadIdx.x) < kBlockM / 2)
      cp_async_16(delta_s + buf * kBlockM + (threadIdx.x - kBlockM / 4) * 4,
                  delta + row + (threadIdx.x - kBlockM / 4) * 4, true);
  };
  // Packed sequences: the id range of the CTA's keys, this thread's two key ids, and the first query tile
  // (from iteration it on) whose range overlaps the keys', with its range in q_range.
  const int32_t* seg_b = SEG ? p.seg + int64_t(b) * p.Tq : nullptr;
  SegRange key_range{0, 0}, q_range{0, 0};
  int key_seg[2];
  if constexpr (SEG) {
    key_range = warp_segment_range<kBlockN>(seg_b, j0, p.Tk, lane);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = j0 + warp * 16 + g + 8 * r;
      key_seg[r] = key < p.Tk ? seg_b[key] : 0;  // keys past Tk are masked anyway
    }
  }
  auto next_iter = [&](int it) {
    if constexpr (SEG) {
      for (; it < n_iters; ++it) {
        q_range = warp_segment_range<kBlockM>(seg_b, m_begin + (it % m_tiles) * kBlockM, p.Tq, lane);
        if (q_range.overlaps(key_range)) break;
      }
    }
    return it;
  };

  int it = next_iter(0);
  if (it < n_iters) load_query_tile(it, 0);
  cp_async_commit();

  float dk_acc[kDT][4], dv_acc[kDT][4];
#pragma unroll
  for (int i = 0; i < kDT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[i][e] = dv_acc[i][e] = 0.f;
  uint32_t kf[Tile::kKVInRegs ? kKT : 1][4], vf[Tile::kKVInRegs ? kKT : 1][4];
  const int key_row0 = warp * 16;                 // this warp's keys within the tile
  const int key_base = j0 + key_row0 + g;         // this thread's keys: key_base and key_base + 8
  const int mq = warp % kRowTiles, cg = warp / kRowTiles;  // this warp's dQ block

  // step counts visited query tiles (step = it without segments).
  for (int step = 0; it < n_iters; ++step) {
    const int buf = step & 1;
    const int h = hk * p.group + it / m_tiles, i0 = m_begin + (it % m_tiles) * kBlockM;
    // Some score of this tile needs the elementwise segment mask.
    const bool seg_mask = SEG && !key_range.same_single(q_range);
    const int it_next = next_iter(it + 1);
    next_tile_async(it_next < n_iters, [&] { load_query_tile(it_next, buf ^ 1); });
    it = it_next;
    if constexpr (Tile::kKVInRegs) {
      if (step == 0) {
#pragma unroll
        for (int kk = 0; kk < kKT; ++kk) {
          ldsm_x4(kf[kk], Ks + (key_row0 + lo.a_row) * kPitch + kk * 16 + lo.a_col);
          ldsm_x4(vf[kk], Vs + (key_row0 + lo.a_row) * kPitch + kk * 16 + lo.a_col);
        }
      }
    }
    const T* Qb = Qs + buf * kBlockM * kPitch;
    const T* dOb = dOs + buf * kBlockM * kPitch;
    const float* lse_b = lse_s + buf * kBlockM;
    const float* delta_b = delta_s + buf * kBlockM;

    // S^T = K Q^T and dP^T = V dO^T: rows = this warp's 16 keys, columns = the tile's queries.
    float st[kMT][4], dpt[kMT][4];
#pragma unroll
    for (int i = 0; i < kMT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[i][e] = dpt[i][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kKT; ++kk) {
      uint32_t ka[4], va[4];
      if constexpr (Tile::kKVInRegs) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          ka[r] = kf[kk][r];
          va[r] = vf[kk][r];
        }
      } else {
        ldsm_x4(ka, Ks + (key_row0 + lo.a_row) * kPitch + kk * 16 + lo.a_col);
        ldsm_x4(va, Vs + (key_row0 + lo.a_row) * kPitch + kk * 16 + lo.a_col);
      }
#pragma unroll
      for (int np = 0; np < kMT / 2; ++np) {
        uint32_t bb[4];
        ldsm_x4(bb, Qb + (np * 16 + lo.b_row) * kPitch + kk * 16 + lo.b_col);
        mma_16816<T>(st[2 * np], ka, bb[0], bb[1]);
        mma_16816<T>(st[2 * np + 1], ka, bb[2], bb[3]);
        ldsm_x4(bb, dOb + (np * 16 + lo.b_row) * kPitch + kk * 16 + lo.b_col);
        mma_16816<T>(dpt[2 * np], va, bb[0], bb[1]);
        mma_16816<T>(dpt[2 * np + 1], va, bb[2], bb[3]);
      }
    }

    // P^T = exp(scale S^T - lse) and dS^T = P^T * (dP^T - delta), in place.
    const bool edge = j0 + kBlockN > p.Tk || (p.causal && j0 + kBlockN - 1 > i0 + off) || seg_mask;
#pragma unroll
    for (int nt = 0; nt < kMT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = nt * 8 + 2 * t + (e & 1);
        float pr = fast_exp2(fmaf(st[nt][e], p.scale_log2, -lse_b[qi]));
        if (edge) {
          const int key = key_base + (e >> 1) * 8;
          bool masked = key >= p.Tk || (p.causal && key > i0 + qi + off);
          // Query rows past Tq already have p = 0 (lse2 = +inf), and their ids are not there to read.
          if constexpr (SEG)
            masked = masked || (seg_mask && i0 + qi < p.Tq && seg_b[i0 + qi] != key_seg[e >> 1]);
          if (masked) pr = 0.f;
        }
        st[nt][e] = pr;
        dpt[nt][e] = pr * (dpt[nt][e] - delta_b[qi]);
      }

    // dV += P^T dO and dK += dS^T Q (k index = queries).
#pragma unroll
    for (int kq = 0; kq < kBlockM / 16; ++kq) {
      uint32_t pa[4], da[4];
      acc_to_a<T>(pa, st[2 * kq], st[2 * kq + 1]);
      acc_to_a<T>(da, dpt[2 * kq], dpt[2 * kq + 1]);
#pragma unroll
      for (int dp = 0; dp < kDT / 2; ++dp) {
        uint32_t bb[4];
        ldsm_x4_t(bb, dOb + (kq * 16 + lo.a_row) * kPitch + dp * 16 + lo.a_col);
        mma_16816<T>(dv_acc[2 * dp], pa, bb[0], bb[1]);
        mma_16816<T>(dv_acc[2 * dp + 1], pa, bb[2], bb[3]);
        ldsm_x4_t(bb, Qb + (kq * 16 + lo.a_row) * kPitch + dp * 16 + lo.a_col);
        mma_16816<T>(dk_acc[2 * dp], da, bb[0], bb[1]);
        mma_16816<T>(dk_acc[2 * dp + 1], da, bb[2], bb[3]);
      }
    }

    // dS^T to shared memory: dQ sums over all the tile's keys, i.e. across warps.
#pragma unroll
    for (int nt = 0; nt < kMT; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        *reinterpret_cast<uint32_t*>(dSs + (key_row0 + g + 8 * r) * kSPitch + nt * 8 + 2 * t) =
            pack2<T>(dpt[nt][2 * r], dpt[nt][2 * r + 1]);
    __syncthreads();

    // dQ[mq block, cg columns] += dS K (k index = keys), added into the fp32 accumulator.
    float dq[kCT][4];
#pragma unroll
    for (int i = 0; i < kCT; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[4];
      ldsm_x4_t(a, dSs + (kk * 16 + lo.b_row) * kSPitch + mq * 16 + lo.b_col);
      const T* k_rows = Ks + (kk * 16 + lo.a_row) * kPitch + cg * kCols;
#pragma unroll
      for (int cp = 0; cp < kCT / 2; ++cp) {
        uint32_t bb[4];
        ldsm_x4_t(bb, k_rows + cp * 16 + lo.a_col);
        mma_16816<T>(dq[2 * cp], a, bb[0], bb[1]);
        mma_16816<T>(dq[2 * cp + 1], a, bb[2], bb[3]);
      }
      if constexpr (kCT % 2 == 1) {
        uint32_t b2[2];
        ldsm_x2_t(b2, k_rows + (kCT - 1) * 8);
        mma_16816<T>(dq[kCT - 1], a, b2[0], b2[1]);
      }
    }
    float* dq_rows = dq_acc + (int64_t(b) * p.Hq + h) * p.Tq * D + cg * kCols + 2 * t;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = i0 + mq * 16 + g + 8 * r;
      if (row < p.Tq) {
#pragma unroll
        for (int ct = 0; ct < kCT; ++ct) {
          float* dst = dq_rows + int64_t(row) * D + ct * 8;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
          atomicAdd(reinterpret_cast<float2*>(dst), make_float2(dq[ct][2 * r], dq[ct][2 * r + 1]));
#else
          atomicAdd(dst, dq[ct][2 * r]);
          atomicAdd(dst + 1, dq[ct][2 * r + 1]);
#endif
        }
      }
    }
    // The next iteration's first __syncthreads keeps dSs and this buffer alive until every warp is done.
  }

  // K / V may still be in flight when there was no query tile; every warp is past its last dQ read of Ks.
  cp_async_wait<0>();
  __syncthreads();
  // Stage this warp's 16 rows of dK (scaled) and dV over its own K and V rows, then write them out.
  T* dk_warp = Ks + key_row0 * kPitch;
  T* dv_warp = Vs + key_row0 * kPitch;
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      *reinterpret_cast<uint32_t*>(dk_warp + (g + 8 * r) * kPitch + dt * 8 + 2 * t) =
          pack2<T>(dk_acc[dt][2 * r] * p.scale, dk_acc[dt][2 * r + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(dv_warp + (g + 8 * r) * kPitch + dt * 8 + 2 * t) =
          pack2<T>(dv_acc[dt][2 * r], dv_acc[dt][2 * r + 1]);
    }
  __syncwarp();
  T* dkb = dk + int64_t(b) * p.Tk * p.ks + int64_t(hk) * DM;
  T* dvb = dv + int64_t(b) * p.Tk * p.vs + int64_t(hk) * DM;
  constexpr int kDMT = DM / 8;  // 16-byte chunks of a row in memory
#pragma unroll
  for (int c = lane; c < 16 * kDMT; c += 32) {
    int rr = c / kDMT, ch = c % kDMT, key = j0 + key_row0 + rr;
    if (key < p.Tk) {
      *reinterpret_cast<uint4*>(dkb + int64_t(key) * p.ks + ch * 8) =
          *reinterpret_cast<const uint4*>(dk_warp + rr * kPitch + ch * 8);
      *reinterpret_cast<uint4*>(dvb + int64_t(key) * p.vs + ch * 8) =
          *reinterpret_cast<const uint4*>(dv_warp + rr * kPitch + ch * 8);
    }
  }
}

// dq[b, i, h, :DM] = scale * dq_acc[b, h, i, :DM] in the storage type (dq_acc rows D wide), 8 elements
// per thread.
template <class T>
__global__ void flash_dq_convert_kernel(T* dq, const float* dq_acc, Shape p, int DM, int D, int64_t chunks) {
  int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= chunks) return;
  const int per_row = DM / 8;
  const int64_t row = c / per_row;  // (b * Hq + h) * Tq + i
  const int ch = int(c % per_row);
  const int i = int(row % p.Tq);
  const int64_t bh = row / p.Tq;
  const int b = int(bh / p.Hq), h = int(bh % p.Hq);
  const float4* src = reinterpret_cast<const float4*>(dq_acc + row * D + ch * 8);
  float4 x0 = src[0], x1 = src[1];
  uint4 packed;
  packed.x = pack2<T>(x0.x * p.scale, x0.y * p.scale);
  packed.y = pack2<T>(x0.z * p.scale, x0.w * p.scale);
  packed.z = pack2<T>(x1.x * p.scale, x1.y * p.scale);
  packed.w = pack2<T>(x1.z * p.scale, x1.w * p.scale);
  *reinterpret_cast<uint4*>(dq + (int64_t(b) * p.Tq + i) * p.qs + int64_t(h) * DM + ch * 8) = packed;
}

// ---------------------------------------------------------------------------------------------
// Host side

Shape make_shape(int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t qs, int64_t ks, int64_t vs, int64_t os,
                 float scale, bool causal, const int32_t* segments) {
  check_segments_shape(segments, Tq, Tk);
  return Shape{int(Tq), int(Tk), int(Hq), int(Hkv), int(Hq / Hkv), qs, ks, vs, os, scale, scale * kLog2e, causal,
               segments};
}

// Calls fn(std::integral_constant<int, D>) for a supported head dim.
template <class Fn>
void dispatch_head_dim(int64_t D, Fn&& fn) {
  switch (D) {
    case 40: fn(std::integral_constant<int, 40>{}); break;
    case 64: fn(std::integral_constant<int, 64>{}); break;
    case 80: fn(std::integral_constant<int, 80>{}); break;
    case 128: fn(std::integral_constant<int, 128>{}); break;
    case 160: fn(std::integral_constant<int, 160>{}); break;
    default: ZP_FATAL("flash attention: head dim ", D, " unsupported");
  }
}

template <class Fn>
void dispatch_half(DType dt, Fn&& fn) {
  switch (dt) {
    case DType::BF16: fn(__nv_bfloat16{}); break;
    case DType::F16: fn(__half{}); break;
    default: ZP_FATAL("flash attention: dtype ", dtype_name(dt), " unsupported");
  }
}

// mma.sync with bf16 operands, ldmatrix and cp.async all need sm_80.
bool device_is_ampere_or_newer() { return device_compute_major() >= 8; }


template <class T, class Tile, bool SEG>
void launch_forward(StreamHandle s, void* out, float* lse, const void* q, const void* k, const void* v, int64_t B,
                    int64_t Tq, int64_t Hq, const Shape& p) {
  auto kernel = flash_forward_kernel<T, Tile, SEG>;
  constexpr size_t bytes = Tile::smem_bytes();
  allow_dynamic_smem(kernel, bytes, "flash attention forward");
  const int64_t blocks = B * Hq * ceil_div(Tq, Tile::kBlockM);
  ZP_CHECK(blocks <= INT_MAX, "flash attention: B * Hq * query tiles = ", blocks, " too many");
  kernel<<<unsigned(blocks), Tile::kWarps * 32, bytes, s>>>(static_cast<T*>(out), lse, static_cast<const T*>(q),
                                                static_cast<const T*>(k), static_cast<const T*>(v), p);
  ZP_CUDA_LAUNCH_CHECK();
}

template <class T, class Tile, bool SEG>
void launch_backward(StreamHandle s, void* dk, void* dv, float* dq_acc, const void* dout, const void* q,
                     const void* k, const void* v, const float* lse2, const float* delta, int64_t B, int64_t Tk,
                     int64_t Hkv, const Shape& p, int64_t Tq_pad) {
  auto kernel = flash_backward_kernel<T, Tile, SEG>;
  constexpr size_t bytes = Tile::smem_bytes();
  allow_dynamic_smem(kernel, bytes, "flash attention backward");
  const int64_t blocks = B * Hkv * ceil_div(Tk, 16 * Tile::kWarps);
  ZP_CHECK(blocks <= INT_MAX, "flash attention: B * Hkv * key tiles = ", blocks, " too many");
  kernel<<<unsigned(blocks), Tile::kWarps * 32, bytes, s>>>(static_cast<T*>(dk), static_cast<T*>(dv), dq_acc,
                                                static_cast<const T*>(dout), static_cast<const T*>(q),
                                                static_cast<const T*>(k), static_cast<const T*>(v), lse2, delta, p,
                                                int(Tq_pad));
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace

bool attention_uses_flash(DType dt, int64_t D, int64_t q_stride, int64_t k_stride, int64_t v_stride,
                          int64_t o_stride) {
  if (dt != DType::BF16 && dt != DType::F16) return false;
  if (D != 40 && D != 64 && D != 80 && D != 128 && D != 160) return false;
  for (int64_t s : {q_stride, k_stride, v_stride, o_stride})
    if (s % 8 != 0) return false;  // 0 (contiguous) is Hq*D or Hkv*D, a multiple of 8 for these D
  return device_is_ampere_or_newer();
}

bool flash_attention_aligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

void flash_attention_forward(StreamHandle s, DType dt, void* out, float* lse, const void* q, const void* k,
                             const void* v, int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D,
                             int64_t q_stride, int64_t k_stride, int64_t v_stride, int64_t o_stride, float scale,
                             bool causal, const int32_t* segments) {
  if (B == 0 || Tq == 0) return;
  Shape p = make_shape(Tq, Tk, Hq, Hkv, q_stride, k_stride, v_stride, o_stride, scale, causal, segments);
  dispatch_half(dt, [&](auto tag) {
    using T = decltype(tag);
    dispatch_head_dim(D, [&](auto dtag) {
      using Tile = typename FwdTileFor<decltype(dtag)::value>::type;
      if (segments) launch_forward<T, Tile, true>(s, out, lse, q, k, v, B, Tq, Hq, p);
      else launch_forward<T, Tile, false>(s, out, lse, q, k, v, B, Tq, Hq, p);
    });
  });
}

void flash_attention_backward(StreamHandle s, DType dt, void* dq, void* dk, void* dv, const void* dout,
                              const void* q, const void* k, const void* v, const void* out, const float* lse,
                              int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D,
                              int64_t q_stride, int64_t k_stride, int64_t v_stride, int64_t o_stride, float scale,
                              bool causal, const int32_t* segments) {
  if (B == 0) return;
  Shape p = make_shape(Tq, Tk, Hq, Hkv, q_stride, k_stride, v_stride, o_stride, scale, causal, segments);
  const int64_t Tq_pad = (Tq + kRowPad - 1) / kRowPad * kRowPad;
  const int64_t pad_rows = B * Hq * Tq_pad;
  dispatch_half(dt, [&](auto tag) {
    using T = decltype(tag);
    dispatch_head_dim(D, [&](auto dtag) {
      using Tile = typename BwdTileFor<decltype(dtag)::value>::type;
      constexpr int Dc = Tile::D;  // the head dim computed, dq_acc's row width
      // Scratch: delta and lse2 [B, Hq, Tq_pad], then the fp32 dQ accumulator [B, Hq, Tq, Dc].
      const size_t scratch_floats = size_t(2 * pad_rows + B * Hq * Tq * Dc);
      KernelScratch scratch_mem(s, scratch_floats * sizeof(float), "attention_scratch");
      float* delta = scratch_mem.as<float>();
      float* lse2 = delta + pad_rows;
      float* dq_acc = delta + 2 * pad_rows;
      if (pad_rows > 0) {
        constexpr int kThreads = 256;
        flash_backward_prep_kernel<T><<<ceil_div(pad_rows, kThreads / 8), kThreads, 0, s>>>(
            delta, lse2, dq_acc, static_cast<const T*>(dout), static_cast<const T*>(out), lse, p, int(D), Dc,
            int(Tq_pad), pad_rows);
        ZP_CUDA_LAUNCH_CHECK();
      }
      if (Tk > 0) {
        if (segments)
          launch_backward<T, Tile, true>(s, dk, dv, dq_acc, dout, q, k, v, lse2, delta, B, Tk, Hkv, p, Tq_pad);
        else
          launch_backward<T, Tile, false>(s, dk, dv, dq_acc, dout, q, k, v, lse2, delta, B, Tk, Hkv, p, Tq_pad);
      }
      const int64_t chunks = B * Hq * Tq * (D / 8);
      if (chunks > 0) {
        flash_dq_convert_kernel<T><<<ceil_div(chunks, 256), 256, 0, s>>>(static_cast<T*>(dq), dq_acc, p, int(D), Dc,
                                                                          chunks);
        ZP_CUDA_LAUNCH_CHECK();
      }
    });
  });
}

}  // namespace zp::kernels::cuda
