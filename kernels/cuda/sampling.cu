// Token sampling, one block per row, with no sort and no copy of the row: every step is a pass over
// the (bf16) row that recomputes each token's processed logit on the fly. The tricks:
//  - Thresholds by radix selection, 8 bits a pass, over an order-preserving 32-bit key of the
//    processed logit: top-k counts tokens per bin, top-p adds their weights per bin. A bf16 value as
//    a float has 16 zero low bits, so a bf16 row with no penalty is done in two passes.
//  - Weights are integers, exp((l - max) / T) scaled by 2^40 and rounded, so every sum (histogram
//    bins, block scans) is exact whatever order the atomics land in: the top-p mass, the kept total
//    and the draw's prefix sum agree to the last unit, the draw always finds its token, and a row's
//    token is a deterministic function of its logits and params.
//  - The draw walks the row in index order in tiles; a block-wide exclusive scan of the per-thread
//    weights of a tile tells the one thread whose range holds the target which token it is.
//  - The repetition penalty is a bitmap of the row's history in shared memory, set with atomicOr
//    (a token listed twice sets one bit, so it is penalised once) and looked up by every pass. The
//    logits are never written, so the raw row is still there for the logprobs.
//  - A few rows (a decode step) would leave most SMs idle, so their first pass (the greedy token
//    and the logsumexp) runs in slices over many blocks first, which the row's block then merges.
// Params live on the device, so nothing here can reject bad ones: check_sampling_params on the host.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/scratch.cuh"
#include "kernels/sampling.h"
#include "kernels/sampling_hash.h"

namespace zp::kernels::cuda {
namespace {

constexpr int kThreads = 512;  // select_bin needs at least 256
constexpr float kWeightScale = 0x1p40f;  // 152k weights <= 2^40 sum far below 2^64

// Unsigned order of the keys = numeric order of the floats (-inf lowest; -0 is folded into +0 first).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

template <class T>
struct Row {
  const T* x;
  int64_t V;
  bool vec;               // 16-byte packs
  const uint32_t* marks;  // the history bitmap; nullptr: no penalty
  float penalty;

  // The logit after the penalty; NaN counts as -inf, as on the CPU.
  __device__ __forceinline__ float value(int64_t c, float raw) const {
    float v = raw;
    if (marks && ((marks[c >> 5] >> (c & 31)) & 1u)) v = v < 0.f ? v * penalty : v / penalty;
    if (isnan(v)) v = -INFINITY;
    return v == 0.f ? 0.f : v;
  }

  // f(c, raw value) for this thread's share of the V real columns (padding is never read), in
  // increasing c. The packs are loaded kBatch at a time before f sees any of them: one load, then f,
  // then the next left a pass over a 128k vocabulary latency-bound (31 round trips per thread).
  template <class F>
  __device__ __forceinline__ void for_each(F&& f) const {
    for_each_in(0, V, f);
  }
  // The same over columns [c0, c1); c0 is a multiple of 16 / sizeof(T).
  template <class F>
  __device__ __forceinline__ void for_each_in(int64_t c0, int64_t c1, F&& f) const {
    constexpr int VEC = 16 / sizeof(T), kBatch = 8;
    using P = Pack<T, VEC>;
    int64_t start = c0;
    if (vec) {
      const int64_t n_packs = c1 / VEC, step = blockDim.x;
      const P* packs = reinterpret_cast<const P*>(x);
      int64_t i = c0 / VEC + threadIdx.x;
      for (; i + (kBatch - 1) * step < n_packs; i += kBatch * step) {
        P p[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) p[b] = packs[i + b * step];
#pragma unroll
        for (int b = 0; b < kBatch; ++b)
#pragma unroll
          for (int k = 0; k < VEC; ++k) f((i + b * step) * VEC + k, to_f(p[b].v[k]));
      }
      for (; i < n_packs; i += step) {
        const P p = packs[i];
#pragma unroll
        for (int k = 0; k < VEC; ++k) f(i * VEC + k, to_f(p.v[k]));
      }
      start = n_packs * VEC;
    }
    for (int64_t c = start + threadIdx.x; c < c1; c += blockDim.x) f(c, to_f(x[c]));
  }
};

// Exclusive prefix sum in thread order; *total = the block's sum. Safe to call back to back.
__device__ uint64_t block_exclusive_scan(uint64_t v, uint64_t* total) {
  __shared__ uint64_t warp_sums[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  uint64_t incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  __syncthreads();  // the previous call's readers are done with warp_sums
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  uint64_t before = 0, all = 0;
  for (int w = 0; w < nwarps; ++w) {
    const uint64_t s = warp_sums[w];
    if (w < warp) before += s;
    all += s;
  }
  *total = all;
  return before + incl - v;
}

struct ArgMax {
  float v;
  int64_t i;
};
__device__ __forceinline__ bool better(ArgMax a, ArgMax b) { return a.v > b.v || (a.v == b.v && a.i < b.i); }
__device__ __forceinline__ ArgMax warp_argmax(ArgMax a) {
  for (int o = 16; o > 0; o >>= 1) {
    const ArgMax b{__shfl_xor_sync(0xffffffffu, a.v, o), __shfl_xor_sync(0xffffffffu, a.i, o)};
    if (better(b, a)) a = b;
  }
  return a;
}
// The largest value, the lowest index among equal ones; every thread gets it.
__device__ ArgMax block_argmax(ArgMax a) {
  __shared__ float sv[32];
  __shared__ int64_t si[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  a = warp_argmax(a);
  __syncthreads();
  if (lane == 0) sv[warp] = a.v, si[warp] = a.i;
  __syncthreads();
  a = lane < int(blockDim.x >> 5) ? ArgMax{sv[lane], si[lane]} : ArgMax{-INFINITY, INT64_MAX};
  return warp_argmax(a);
}

// Of 256 bins (bin 255 holds the largest keys), the bin d where the weight counted from the top
// first reaches need = need_of(total): sfx(d) >= need > sfx(d + 1), sfx(b) = sum of hist[b..255].
// need_of must return a value in [1, total]. *above = sfx(d + 1), *at = hist[d]; returns d.
template <class NeedOf>
__device__ int select_bin(const uint64_t* hist, NeedOf need_of, uint64_t* need, uint64_t* above, uint64_t* at) {
  __shared__ uint64_t warp_tot[8];
  __shared__ uint64_t s_total, s_above, s_at;
  __shared__ int s_bin;
  const int b = threadIdx.x, lane = b & 31, warp = b >> 5;
  uint64_t h = 0, sfx = 0;
  if (b < 256) {  // whole warps
    h = hist[b];
    sfx = h;
    for (int o = 1; o < 32; o <<= 1) {
      const uint64_t n = __shfl_down_sync(0xffffffffu, sfx, o);
      if (lane + o < 32) sfx += n;
    }
    if (lane == 0) warp_tot[warp] = sfx;
  }
  __syncthreads();
  if (b < 256) {
    for (int w = warp + 1; w < 8; ++w) sfx += warp_tot[w];
    if (b == 0) s_total = sfx;
  }
  __syncthreads();
  const uint64_t n = need_of(s_total);
  if (b < 256 && sfx >= n && sfx - h < n) s_bin = b, s_above = sfx - h, s_at = h;
  __syncthreads();
  *need = n;
  *above = s_above;
  *at = s_at;
  return s_bin;
}

// The threshold key, by radix selection from the top byte down to bit `lo`, among the tokens whose
// key `keep` admits: the largest t for which the weight of those with key >= t reaches need_of(their
// total weight). A key is at or above it iff (key & mask) >= prefix; *mass = the weight at or above.
template <class T, class Keep, class Weight, class NeedOf>
__device__ void radix_select(const Row<T>& row, uint64_t* hist, int lo, Keep keep, Weight weight, NeedOf need_of,
                             uint32_t* prefix, uint32_t* mask, uint64_t* mass) {
  uint32_t pre = 0, msk = 0;
  uint64_t need = 0, above_all = 0;
  for (int shift = 24; shift >= lo; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    // Random logits crowd into a few bins (the top byte is mostly the exponent), so a thread adds up
    // runs of equal bins before it touches shared memory: fewer atomics on the same few addresses.
    unsigned run_bin = 0;
    uint64_t run_w = 0;
    auto flush = [&] {
      if (run_w) atomicAdd(reinterpret_cast<unsigned long long*>(&hist[run_bin]), (unsigned long long)run_w);
    };
    row.for_each([&](int64_t c, float raw) {
      const float v = row.value(c, raw);
      const uint32_t key = order_key(v);
      if ((key & msk) != pre || !keep(key)) return;
      const unsigned bin = (key >> shift) & 255u;
      if (bin != run_bin) {
        flush();
        run_bin = bin;
        run_w = 0;
      }
      run_w += weight(v);
    });
    flush();
    __syncthreads();
    uint64_t above, at;
    const uint64_t rest = need;
    const bool first = shift == 24;
    const int d = select_bin(hist, [&](uint64_t total) { return first ? need_of(total) : rest; }, &need, &above, &at);
    need -= above;
    above_all += above;
    pre |= uint32_t(d) << shift;
    msk |= 0xffu << shift;
    *mass = above_all + at;
  }
  *prefix = pre;
  *mask = msk;
}

// One draw from the processed row: temperature, top-k, top-p, then the inverse CDF in index order.
// m and am: the largest processed logit and its lowest index.
template <class T>
__device__ int64_t draw_token(const Row<T>& row, const SamplingParams& P, float m, int64_t am, int lo) {
  __shared__ uint64_t hist[256];
  const float temp = P.temperature;
  auto weight = [=](float v) -> uint64_t {
    const float w = v == m ? 1.f : expf((v - m) / temp);  // v == m also covers m = +-inf
    return __float2ull_rn(w * kWeightScale);
  };

  uint32_t k_prefix = 0, k_mask = 0;
  if (P.top_k > 0 && P.top_k < row.V) {
    uint64_t unused;
    const uint64_t k = uint64_t(P.top_k);
    radix_select(row, hist, lo, [](uint32_t) { return true; }, [](float) -> uint64_t { return 1; },
                 [=](uint64_t) { return k; }, &k_prefix, &k_mask, &unused);
  }
  auto kept_k = [=](uint32_t key) { return (key & k_mask) >= k_prefix; };

  uint32_t p_prefix = 0, p_mask = 0;
  uint64_t mass = 0;
  if (P.top_p < 1.f) {
    const double top_p = double(P.top_p) - kTopPSlack;
    auto need_of = [=](uint64_t total) -> uint64_t {
      const double t = ceil(top_p * double(total));  // mass / total >= top_p, in whole units
      return t < 1.0 ? uint64_t(1) : t >= double(total) ? total : uint64_t(t);
    };
    radix_select(row, hist, lo, kept_k, weight, need_of, &p_prefix, &p_mask, &mass);
  } else {
    uint64_t local = 0;
    row.for_each([&](int64_t c, float raw) {
      const float v = row.value(c, raw);
      if (kept_k(order_key(v))) local += weight(v);
    });
    block_exclusive_scan(local, &mass);
  }
  auto kept = [=](uint32_t key) { return kept_k(key) && (key & p_mask) >= p_prefix; };

  // The first kept token whose inclusive prefix weight exceeds U = floor(u * mass): exact integers,
  // so it exists (the maximum's weight is 2^40, so mass > 0).
  const double u = sampling_uniform_bits(P.seed, P.draw);
  uint64_t U = uint64_t(u * double(mass));
  if (U >= mass) U = mass - 1;
  constexpr int E = 16 / sizeof(T);
  __shared__ int64_t s_found;
  if (threadIdx.x == 0) s_found = -1;  // first read after the scan's barriers
  uint64_t carry = 0;
  for (int64_t tile = 0; tile < row.V; tile += int64_t(blockDim.x) * E) {
    const int64_t c0 = tile + int64_t(threadIdx.x) * E;
    float raw[E];
    if (row.vec && c0 + E <= row.V) {
      const Pack<T, E> p = reinterpret_cast<const Pack<T, E>*>(row.x)[c0 / E];
#pragma unroll
      for (int k = 0; k < E; ++k) raw[k] = to_f(p.v[k]);
    } else {
#pragma unroll
      for (int k = 0; k < E; ++k) raw[k] = c0 + k < row.V ? to_f(row.x[c0 + k]) : -INFINITY;
    }
    uint64_t w[E], local = 0;
#pragma unroll
    for (int k = 0; k < E; ++k) {
      // Past the row's end there is no token, and no bit of the history bitmap to read either.
      w[k] = 0;
      if (c0 + k < row.V) {
        const float v = row.value(c0 + k, raw[k]);
        if (kept(order_key(v))) w[k] = weight(v);
      }
      local += w[k];
    }
    uint64_t total;
    const uint64_t start = carry + block_exclusive_scan(local, &total);
    if (local > 0 && start <= U && U < start + local) {  // one thread at most
      uint64_t run = start;
      int k = 0;
      while ((run += w[k]) <= U) ++k;
      s_found = c0 + k;
    }
    __syncthreads();
    if (s_found >= 0) break;
    carry += total;
  }
  return s_found >= 0 ? s_found : am;
}

// What the first pass over a row (or a slice of it) finds: the greedy token and, for the logprobs,
// the raw logits' running max and sum.
struct RowScan {
  ArgMax best;
  MaxSum ms;
};

template <class T>
__device__ RowScan scan_columns(const Row<T>& row, int64_t c0, int64_t c1, bool lse) {
  MaxSum ms{-INFINITY, 0.f};
  ArgMax best{-INFINITY, INT64_MAX};
  row.for_each_in(c0, c1, [&](int64_t c, float raw) {
    if (lse) ms = add_value(ms, raw);
    const ArgMax a{row.value(c, raw), c};
    if (better(a, best)) best = a;
  });
  if (lse) ms = block_merge(ms);
  return {block_argmax(best), ms};
}

// Few rows (a decode step of a handful of sequences): one block per row left the first pass, a
// compute-bound walk over the whole vocabulary on one SM (27 us for Llama 3's 128k on an H200), so
// grid (rows, slices) scans slices of each row first and the sampling kernel merges their results.
// Only rows without a repetition penalty (no history bitmap here).
template <class T>
__global__ void __launch_bounds__(kThreads)
    scan_slices_kernel(RowScan* out, const T* logits, int64_t V, int64_t ld, bool vec, int64_t slice, bool lse) {
  const Row<T> row{logits + int64_t(blockIdx.x) * ld, V, vec, nullptr, 1.f};
  const int64_t c0 = int64_t(blockIdx.y) * slice;
  const RowScan r = scan_columns(row, c0, min(V, c0 + slice), lse);
  if (threadIdx.x == 0) out[int64_t(blockIdx.x) * gridDim.y + blockIdx.y] = r;
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    sample_tokens_kernel(int32_t* tokens, float* logprobs, const T* logits, int64_t V, int64_t ld, bool vec,
                         const SamplingParams* params, const int32_t* history, const int64_t* history_starts,
                         const RowScan* slices, int num_slices) {
  extern __shared__ uint32_t marks[];
  const int64_t r = blockIdx.x;
  const SamplingParams P = params[r];
  const bool pen = P.repetition_penalty != 1.f && history && history_starts;
  if (pen) {
    for (int64_t i = threadIdx.x; i < (V + 31) / 32; i += blockDim.x) marks[i] = 0;
    __syncthreads();
    for (int64_t i = history_starts[r] + threadIdx.x; i < history_starts[r + 1]; i += blockDim.x) {
      const int32_t t = history[i];
      if (t >= 0 && t < V) atomicOr(&marks[t >> 5], 1u << (t & 31));
    }
    __syncthreads();
  }
  const Row<T> row{logits + r * ld, V, vec, pen ? marks : nullptr, P.repetition_penalty};

  // One pass for the greedy token (and the maximum the sampling needs) and the raw logsumexp, or
  // the merge of the slices' passes.
  RowScan scan;
  if (slices) {
    RowScan mine{{-INFINITY, INT64_MAX}, {-INFINITY, 0.f}};
    if (int(threadIdx.x) < num_slices) mine = slices[r * num_slices + threadIdx.x];
    scan.best = block_argmax(mine.best);
    scan.ms = logprobs ? block_merge(mine.ms) : mine.ms;
  } else {
    scan = scan_columns(row, 0, V, logprobs != nullptr);
  }
  const ArgMax best = scan.best;
  const float lse = logprobs ? scan.ms.m + logf(scan.ms.s) : 0.f;

  int64_t tok = best.i;
  if (P.temperature > 0.f) {
    // A bf16 key's low 16 bits are zero unless the penalty divided the value.
    const int lo = !pen && std::is_same_v<T, __nv_bfloat16> ? 16 : 0;
    tok = draw_token(row, P, best.v, best.i, lo);
  }
  if (threadIdx.x == 0) {
    tokens[r] = int32_t(tok);
    if (logprobs) logprobs[r] = to_f(row.x[tok]) - lse;
  }
}

}  // namespace

void sample_tokens(StreamHandle s, DType dt, int32_t* tokens, float* logprobs, void* logits, int64_t S, int64_t V,
                   int64_t ld, const SamplingParams* params, const int32_t* history, const int64_t* history_starts) {
  ZP_CHECK(S >= 0 && V > 0 && ld >= V && V <= INT32_MAX, "sample_tokens: S ", S, ", V ", V, ", ld ", ld);
  if (S == 0) return;
  const size_t bitmap_bytes = size_t((V + 31) / 32) * sizeof(uint32_t);
  // Rows that leave most SMs idle (and no history, so no penalty) are first scanned in slices: about
  // two blocks per SM, at most kThreads slices a row, at least 4096 columns a slice.
  const int64_t sms = sm_count();
  int64_t num_slices = 1, slice = V;
  if (!history && S < sms) {
    num_slices = std::min<int64_t>({kThreads, (2 * sms + S - 1) / S, (V + 4095) / 4096});
    slice = ((V + num_slices - 1) / num_slices + 15) / 16 * 16;  // whole packs
    num_slices = (V + slice - 1) / slice;
  }
  KernelScratch scratch(s, num_slices > 1 ? size_t(S * num_slices) * sizeof(RowScan) : 0, "sampling slices");
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    auto kernel = sample_tokens_kernel<T>;
    // Below this, bitmap and static shared memory (about 3 KiB) fit the default 48 KiB.
    if (bitmap_bytes > 40 * 1024) allow_dynamic_smem(kernel, bitmap_bytes, "sample_tokens");
    const bool vec = can_vectorise<T>(ld, {logits});
    RowScan* slices = scratch.as<RowScan>();
    if (slices)
      scan_slices_kernel<T><<<dim3(unsigned(S), unsigned(num_slices)), kThreads, 0, s>>>(
          slices, static_cast<const T*>(logits), V, ld, vec, slice, logprobs != nullptr);
    kernel<<<unsigned(S), kThreads, bitmap_bytes, s>>>(tokens, logprobs, static_cast<const T*>(logits), V, ld, vec,
                                                      params, history, history_starts, slices, int(num_slices));
  });
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace zp::kernels::cuda
