// Decode's products (a few rows of x against a weight), for which cuBLASLt's kernels reach a third
// to two thirds of HBM bandwidth on an H200 (a split-K product plus its reduce kernel for K = 8192).
// The trick is only to keep enough weight bytes in flight: a block of 4 warps owns RB consecutive
// output columns and splits K between its 128 threads, each thread issuing its U 16-byte packs of
// each of the RB weight rows before it uses any, with the L1-bypassing streaming load (the weight is
// read once); few registers a thread (U = 1, below) keep many such blocks resident on each SM, and
// they, more than loads per thread, fill the memory pipe. Each x pack is loaded once per thread and
// used for all RB rows. The partial dot products meet in a warp sum and then in shared memory; bias
// and residual are added in fp32 and rounded once, as cuBLASLt's epilogue does.
// The RMSNorm input (kernels/row_linear.h) costs no pass of its own: the norm weight is one more
// pack beside each x pack, and the sum of squares is summed with the dot products (the block's
// threads cover all of K), its rsqrt applied to the finished sums, since sum_k W x w r = r sum_k W x w.
// A SwiGLU output (RowOutput::SwiGLU) gives each block RB / 2 outputs and, for each, its gate row and
// its up row as the block's RB weight rows, so silu(g) * u is one more step of the same epilogue. A
// RoPE + cache output (RowOutput::RopeCache) pairs rows the same way, channel i of a head with channel
// i + D/2, so the rotation (rope.cuh's, on the fp32 sums) and the key and value stores to the cache
// slot are the epilogue too: a decode step's q/k/v projection needs no kernel of its own after it.
// It is launched as a programmatic dependent (cuda_common.cuh) and waits for the kernel ahead before it
// reads anything; decoding with resident weights (ConstantWeightsScope) it issues its first round of
// weight loads before that wait, so the short kernels between two products (RoPE, attention, SwiGLU)
// run while the weights are in flight. x is not restrict-qualified: that would let its loads move
// ahead of the wait (cuda_common.cuh).
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/row_linear.cuh"
#include "kernels/row_linear.h"

namespace zp::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// What an output needs beyond the product: nothing, or for RowOutput::RopeCache the heads, the
// angles and the cache (a __grid_constant__ parameter of that kernel only).
template <RowOutput OUT>
struct Epilogue {};
template <>
struct Epilogue<RowOutput::RopeCache> {
  int Hq, Hkv, D;
  const int32_t* positions;
  const int32_t* slots;
  void* k_cache;
  void* v_cache;
  InvFreq inv_freq;
};

// N is the number of outputs; W has N rows, or 2N (gate rows, then up rows) with a SwiGLU output. With
// a RoPE + cache output N counts pairs (channels i and i + D/2 of a head): W has 2N rows.
template <class T, int M, int RB, int U, RowInput IN, RowOutput OUT>
__global__ void __launch_bounds__(kThreads)
    row_linear_kernel(T* C, int64_t ldc, const T* A, int64_t lda, const T* __restrict__ W, int64_t ldw,
                       int N, int K, const T* __restrict__ bias, const T* c_in, float beta,
                       const T* __restrict__ norm_w, float eps, bool weights_first,
                       const __grid_constant__ Epilogue<OUT> ep) {
  using P = Pack<T, 8>;
  constexpr bool kSwiGLU = OUT == RowOutput::SwiGLU, kRope = OUT == RowOutput::RopeCache;
  static_assert(!(kSwiGLU || kRope) || RB % 2 == 0, "a SwiGLU or RoPE block takes pairs of rows");
  constexpr int kOut = kSwiGLU || kRope ? RB / 2 : RB;  // outputs (pairs) per block
  const int n0 = int(blockIdx.x) * kOut;  // the block's first output
  // Weight row of the block's row r (clamped to a real row past the end; its sum is never written).
  auto weight_row = [&](int r) -> int64_t {
    if constexpr (kSwiGLU) {
      return r < kOut ? min(n0 + r, N - 1) : int64_t(N) + min(n0 + r - kOut, N - 1);
    } else if constexpr (kRope) {  // pair n is channel n % half of head n / half, and that + half
      const int half = ep.D / 2, n = min(n0 + (r < kOut ? r : r - kOut), N - 1);
      return int64_t(n / half) * ep.D + n % half + (r < kOut ? 0 : half);
    } else {
      return min(n0 + r, N - 1);
    }
  };
  pdl_launch_dependents();
  // Everything but the weights may come from the kernel ahead; each thread waits for it once.
  bool waited = !weights_first;
  if (!weights_first) pdl_wait();
  constexpr bool kNorm = IN == RowInput::RmsNorm;
  __shared__ float partial[kWarps][RB][M];
  __shared__ float sq_partial[kWarps][M];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int packs = K / 8;
  float acc[RB][M], sq[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    sq[m] = 0.f;
#pragma unroll
    for (int r = 0; r < RB; ++r) acc[r][m] = 0.f;
  }
  for (int p0 = threadIdx.x; p0 < packs; p0 += kThreads * U) {
    P wv[RB][U];
#pragma unroll
    for (int r = 0; r < RB; ++r) {
      const int4* w = reinterpret_cast<const int4*>(W + weight_row(r) * ldw);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int p = p0 + u * kThreads;
        if (p < packs) {
          const int4 raw = __ldcs(w + p);
          std::memcpy(&wv[r][u], &raw, sizeof(raw));
        }
      }
    }
    if (!waited) {
      pdl_wait();
      waited = true;
    }
    float nwf[U][8];
    if constexpr (kNorm) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int p = p0 + u * kThreads;
        if (p < packs) {
          const P nv = reinterpret_cast<const P*>(norm_w)[p];
#pragma unroll
          for (int e = 0; e < 8; ++e) nwf[u][e] = to_f(nv.v[e]);
        }
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const P* x = reinterpret_cast<const P*>(A + m * lda);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int p = p0 + u * kThreads;
        if (p < packs) {
          const P xv = x[p];
          float xf[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) xf[e] = to_f(xv.v[e]);
          if constexpr (kNorm) {
#pragma unroll
            for (int e = 0; e < 8; ++e) {
              sq[m] = fmaf(xf[e], xf[e], sq[m]);
              xf[e] *= nwf[u][e];
            }
          }
#pragma unroll
          for (int r = 0; r < RB; ++r)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[r][m] = fmaf(to_f(wv[r][u].v[e]), xf[e], acc[r][m]);
        }
      }
    }
  }
  if (!waited) pdl_wait();  // a thread with no pack of K
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int r = 0; r < RB; ++r) {
      const float v = warp_sum(acc[r][m]);
      if (lane == 0) partial[warp][r][m] = v;
    }
    if constexpr (kNorm) {
      const float v = warp_sum(sq[m]);
      if (lane == 0) sq_partial[warp][m] = v;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kOut * M; i += kThreads) {
    const int r = i / M, m = i % M, n = n0 + r;
    if (n >= N) continue;
    float rstd = 1.f;
    if constexpr (kNorm) {
      float ss = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) ss += sq_partial[w][m];
      rstd = rsqrtf(ss / float(K) + eps);
    }
    // The product of the block's row rr, weight row `row`.
    auto product = [&](int rr, int64_t row) {
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) v += partial[w][rr][m];
      v *= rstd;
      return bias ? v + to_f(bias[row]) : v;
    };
    if constexpr (kRope) {
      const int half = ep.D / 2, h = n / half, i = n % half;
      const int64_t c1 = int64_t(h) * ep.D + i;
      float y1 = product(r, c1), y2 = product(r + kOut, c1 + half);
      if (h < ep.Hq + ep.Hkv) {
        const float x1 = y1, x2 = y2;
        rotate_pair(x1, x2, float(ep.positions[m]) * ep.inv_freq.v[i], 1.f, y1, y2);
      }
      const T t1 = from_f<T>(y1), t2 = from_f<T>(y2);
      C[m * ldc + c1] = t1;
      C[m * ldc + c1 + half] = t2;
      const int32_t slot = ep.slots[m];
      if (h >= ep.Hq && slot >= 0) {
        const bool key = h < ep.Hq + ep.Hkv;
        T* at = static_cast<T*>(key ? ep.k_cache : ep.v_cache) +
                (int64_t(slot) * ep.Hkv + (key ? h - ep.Hq : h - ep.Hq - ep.Hkv)) * ep.D + i;
        at[0] = t1;
        at[half] = t2;
      }
    } else if constexpr (kSwiGLU) {
      const float g = product(r, n), u = product(r + kOut, int64_t(N) + n);
      C[m * ldc + n] = from_f<T>(g / (1.f + expf(-g)) * u);
    } else {
      float v = product(r, n);
      if (beta != 0.f) v += beta * to_f(c_in[m * ldc + n]);
      C[m * ldc + n] = from_f<T>(v);
    }
  }
}

bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("ZP_DECODE_GEMV");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

struct Problem {
  RowInput in;
  RowOutput out;
  int64_t N, K;
  const void *A, *B, *bias, *c_in, *norm_w;
  int64_t lda, ldb, ldc;
  float beta, eps;
  void* C;
  const RowRopeCache* rope;
};

// One 16-byte pack per weight row per round (U = 1), 4 rows a block (8 at one row when K gives each
// thread 3-4 packs): fewer registers (46-80 a thread against 72-131 for RB x U = 8) keep more blocks
// resident, which puts more bytes in flight on an H200 than more loads per thread did.
template <class T, int M, RowInput IN, RowOutput OUT>
void launch(StreamHandle s, const Problem& q) {
  const int64_t per_thread = (q.K / 8 + kThreads - 1) / kThreads;
  Epilogue<OUT> ep{};
  int64_t n = q.N;
  if constexpr (OUT == RowOutput::RopeCache) {
    const RowRopeCache& r = *q.rope;
    ep = {int(r.Hq), int(r.Hkv), int(r.D), r.positions, r.slots, r.k_cache, r.v_cache, inv_freqs(r.theta, r.D)};
    n = q.N / 2;
  }
  auto go = [&](auto rb, auto u) {
    constexpr int RB = decltype(rb)::value, U = decltype(u)::value;
    constexpr int outputs = OUT == RowOutput::Plain ? RB : RB / 2;
    launch_dependent(row_linear_kernel<T, M, RB, U, IN, OUT>, dim3(ceil_div(n, outputs)), dim3(kThreads), 0, s,
                     static_cast<T*>(q.C), q.ldc, static_cast<const T*>(q.A), q.lda, static_cast<const T*>(q.B),
                     q.ldb, int(n), int(q.K), static_cast<const T*>(q.bias),
                     static_cast<const T*>(q.c_in ? q.c_in : q.C), q.beta, static_cast<const T*>(q.norm_w), q.eps,
                     ConstantWeightsScope::active(), ep);
  };
  using One = std::integral_constant<int, 1>;
  if constexpr (M == 1)
    if (per_thread > 2 && per_thread <= 4) return go(std::integral_constant<int, 8>{}, One{});
  go(std::integral_constant<int, 4>{}, One{});
}

template <class T, int M, RowInput IN>
void launch_out(StreamHandle s, const Problem& q) {
  if (q.out == RowOutput::SwiGLU) return launch<T, M, IN, RowOutput::SwiGLU>(s, q);
  if (q.out == RowOutput::RopeCache) return launch<T, M, IN, RowOutput::RopeCache>(s, q);
  launch<T, M, IN, RowOutput::Plain>(s, q);
}

template <class T, int M = 1>
void launch_rows(int64_t rows, StreamHandle s, const Problem& q) {
  if constexpr (M < kRowLinearMaxRows) {
    if (rows > M) return launch_rows<T, M + 1>(rows, s, q);
  }
  switch (q.in) {
    case RowInput::Plain: return launch_out<T, M, RowInput::Plain>(s, q);
    case RowInput::RmsNorm: return launch_out<T, M, RowInput::RmsNorm>(s, q);
  }
}

void run(StreamHandle s, DType dt, int64_t M, const Problem& q) {
  if (dt == DType::BF16)
    launch_rows<__nv_bfloat16>(M, s, q);
  else
    launch_rows<__half>(M, s, q);
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace

bool decode_gemv(StreamHandle s, DType dt, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B,
                 int64_t ldb, float beta, void* C, int64_t ldc, const void* bias, const void* c_in) {
  if (!enabled() || N < 1 || N > INT32_MAX || !row_linear_fits(dt, M, K, lda, A, ldb, B, nullptr)) return false;
  run(s, dt, M, {RowInput::Plain, RowOutput::Plain, N, K, A, B, bias, c_in, nullptr, lda, ldb, ldc, beta, 0.f, C,
                 nullptr});
  return true;
}

void row_linear(StreamHandle s, DType dt, RowInput in, RowOutput out, int64_t M, int64_t N, int64_t K, const void* x,
                int64_t ldx, const void* norm_weight, float eps, const void* w, int64_t ldw, const void* bias, void* y,
                int64_t ldy, const void* residual, const RowRopeCache* rope) {
  ZP_CHECK(M >= 0 && N >= 0 && N <= INT32_MAX / 2 && ldy >= N && ldx >= K,
           "row_linear: M=", M, " N=", N, " ldx=", ldx, " ldy=", ldy);
  ZP_CHECK(in != RowInput::RmsNorm || norm_weight, "row_linear: RmsNorm without a norm weight");
  ZP_CHECK(out == RowOutput::Plain || !residual, "row_linear: a SwiGLU or RoPE + cache output takes no residual");
  row_rope_cache_check(out, N, rope);  // also D <= 2 * kRopeMaxHalf
  if (M == 0 || N == 0) return;
  ZP_CHECK(row_linear_fits(dt, M, K, ldx, x, ldw, w, in == RowInput::RmsNorm ? norm_weight : nullptr),
           "row_linear: ", dtype_name(dt), " M=", M, " K=", K, " ldx=", ldx, " ldw=", ldw,
           " is not a problem the CUDA kernel takes (see row_linear_fits)");
  run(s, dt, M, {in, out, N, K, x, w, bias, residual, norm_weight, ldx, ldw, ldy, residual ? 1.f : 0.f, eps, y, rope});
}

}  // namespace zp::kernels::cuda
