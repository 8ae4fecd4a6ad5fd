// Kernel benchmarks on the GPU: achieved TFLOP/s (matrix-bound ops) or GB/s (memory-bound ops) next
// to the device's peak. Times come from CUDA events around each iteration (manual time), so host
// launch overhead between iterations is not counted. `--benchmark_format=json` for CI tracking.
// Peaks come from cuda_peak_bf16_tflops / cuda_peak_dram_gbs (core/device.h).
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/conv2d.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/groupnorm.h"
#include "kernels/layernorm.h"
#include "kernels/paged_attention.h"
#include "kernels/rmsnorm.h"
#include "kernels/sampling.h"
#include "bench_common.h"

namespace zp::bench {
using namespace zp::kernels;

struct Peak {
  double tflops_bf16 = 0, gbs = 0;
};

Peak device_peak() {
  static Peak p{cuda_peak_bf16_tflops(0), cuda_peak_dram_gbs(0)};
  return p;
}

// Times `f` with CUDA events on `s`; reports flop and byte rates over the manual time.
// `reps`: as timed_iterations'.
void run(benchmark::State& st, StreamHandle s, double flops, double bytes, const std::function<void()>& f,
         int reps = 1) {
  const double secs = timed_iterations(st, s, f, {}, reps);
  if (flops > 0) {
    st.counters["TFLOP/s"] = flops / secs / 1e12;
    st.counters["peak_TFLOP/s"] = device_peak().tflops_bf16;
    st.counters["pct_peak"] = device_peak().tflops_bf16 > 0 ? 100 * flops / secs / 1e12 / device_peak().tflops_bf16 : 0;
  } else {
    st.counters["GB/s"] = bytes / secs / 1e9;
    st.counters["peak_GB/s"] = device_peak().gbs;
    st.counters["pct_peak"] = 100 * bytes / secs / 1e9 / device_peak().gbs;
  }
}

Tensor dev_rand(int64_t n, DType dt, float scale = 1.f) {
  Tensor t = Tensor::empty({n}, dt, Device::cuda(), "bench");
  Tensor f = Tensor::empty({n}, DType::F32, Device::cuda(), "bench");
  std::vector<float> h(static_cast<size_t>(n));
  uint64_t x = 88172645463325252ull;
  for (auto& v : h) {  // xorshift: fast and good enough for benchmark data
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    v = scale * (float(x >> 40) / float(1ull << 24) - 0.5f);
  }
  ZP_CHECK(cudaMemcpy(f.data(), h.data(), size_t(n) * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  cuda::cast(nullptr, dt, t.data(), DType::F32, f.data(), n);
  return t;
}

// --- GEMM: row-major C[M,N] = A[M,K] B[K,N]; GPT-2 124M shapes at B*T = 32768 and a square one.
void BM_Gemm(benchmark::State& st) {
  int64_t M = st.range(0), N = st.range(1), K = st.range(2);
  bool trans_b = st.range(3);
  Tensor A = dev_rand(M * K, DType::BF16), B = dev_rand(K * N, DType::BF16), C = dev_rand(M * N, DType::BF16);
  run(st, nullptr, 2.0 * M * N * K, 0, [&] {
    cuda::gemm(nullptr, DType::BF16, DType::BF16, false, trans_b, M, N, K, 1.f, A.data(), K, B.data(),
               trans_b ? K : N, 0.f, C.data(), N);
  });
}
BENCHMARK(BM_Gemm)->ArgNames({"M", "N", "K", "transB"})
    ->Args({32768, 2304, 768, 1})->Args({32768, 768, 768, 1})->Args({32768, 3072, 768, 1})
    ->Args({32768, 768, 3072, 1})->Args({32768, 50304, 768, 1})->Args({8192, 8192, 8192, 0})
    ->UseManualTime()->Unit(benchmark::kMillisecond);

// --- Decode's products: M = 1, 4 or 8 rows against a Llama weight [N, K] (x W^T), what a decode step's
// GEMMs are. A weight stream, so GB/s (weight + rows + output) against HBM's peak; the time is that of
// 16 products. Llama 3.2 1B: q/k/v, o, gate/up, down; Llama 3.1 8B: q/k/v, gate/up, down.
void BM_DecodeGemm(benchmark::State& st) {
  const int64_t M = st.range(0), N = st.range(1), K = st.range(2);
  Tensor A = dev_rand(M * K, DType::BF16), C = dev_rand(M * N, DType::BF16);
  // Enough copies of the weight to cycle through 256 MB, so that no iteration finds its weight in L2
  // (50 MB on an H100), as a decode step does not.
  const int64_t copies = std::max<int64_t>(1, (int64_t(256) << 20) / (2 * N * K));
  Tensor W = dev_rand(copies * N * K, DType::BF16, 0.05f);
  // 16 products back to back per timed iteration, as a decode step (a CUDA graph) runs them: the
  // events' own latency then stops counting as the product's.
  constexpr int kBackToBack = 16;
  int64_t next = 0;
  run(st, nullptr, 0, kBackToBack * 2.0 * double(N * K + M * K + M * N), [&] {
    for (int r = 0; r < kBackToBack; ++r) {
      const void* w = static_cast<const char*>(W.data()) + size_t(next++ % copies) * size_t(2 * N * K);
      cuda::gemm(nullptr, DType::BF16, DType::BF16, false, true, M, N, K, 1.f, A.data(), K, w, K, 0.f, C.data(), N);
    }
  });
}
BENCHMARK(BM_DecodeGemm)->ArgNames({"M", "N", "K"})
    ->Args({1, 3072, 2048})->Args({1, 2048, 2048})->Args({1, 16384, 2048})->Args({1, 2048, 8192})
    ->Args({4, 2048, 2048})->Args({1, 6144, 4096})->Args({1, 28672, 4096})->Args({1, 4096, 14336})
    ->Args({4, 3072, 2048})->Args({4, 16384, 2048})->Args({4, 2048, 8192})->Args({4, 6144, 4096})
    ->Args({4, 4096, 14336})->Args({8, 16384, 2048})->Args({8, 2048, 8192})
    ->UseManualTime()->Unit(benchmark::kMicrosecond);

// --- Attention, causal, B=32? (the GPT-2 step shape: B=32, T=1024, H=12, D=64) forward and backward.
void BM_Attention(benchmark::State& st) {
  int64_t B = st.range(0), T = st.range(1), H = st.range(2), D = st.range(3);
  bool causal = st.range(4), backward = st.range(5);
  int64_t n = B * T * H * D;
  Tensor q = dev_rand(n, DType::BF16), k = dev_rand(n, DType::BF16), v = dev_rand(n, DType::BF16);
  Tensor o = dev_rand(n, DType::BF16), dout = dev_rand(n, DType::BF16);
  Tensor dq = dev_rand(n, DType::BF16), dk = dev_rand(n, DType::BF16), dv = dev_rand(n, DType::BF16);
  Tensor lse = Tensor::empty({B * H * T}, DType::F32, Device::cuda());
  float scale = attention_default_scale(D);
  double fwd = 4.0 * B * H * T * T * D * (causal ? 0.5 : 1.0);
  cuda::attention_forward(nullptr, DType::BF16, o.data(), lse.data<float>(), q.data(), k.data(), v.data(), B, T, T,
                          H, H, D, H * D, H * D, H * D, H * D, scale, causal);
  run(st, nullptr, backward ? 2.5 * fwd : fwd, 0, [&] {
    if (!backward)
      cuda::attention_forward(nullptr, DType::BF16, o.data(), lse.data<float>(), q.data(), k.data(), v.data(), B, T,
                              T, H, H, D, H * D, H * D, H * D, H * D, scale, causal);
    else
      cuda::attention_backward(nullptr, DType::BF16, dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                               v.data(), o.data(), lse.data<float>(), B, T, T, H, H, D, H * D, H * D, H * D, H * D,
                               scale, causal);
  });
}
BENCHMARK(BM_Attention)->ArgNames({"B", "T", "H", "D", "causal", "bwd"})
    ->Args({32, 1024, 12, 64, 1, 0})->Args({32, 1024, 12, 64, 1, 1})
    ->Args({8, 4096, 5, 64, 0, 0})  // 320 channels at 64x64 latents in heads of 64 (B=8)
    ->Args({8, 4096, 8, 40, 0, 0})->Args({8, 4096, 8, 40, 0, 1})  // SD 1.5's: 8 heads of 40
    ->Args({8, 256, 8, 160, 0, 0})->Args({8, 256, 8, 160, 0, 1})  // and of 160 at 16x16
    ->UseManualTime()->Unit(benchmark::kMillisecond);

// --- Paged decode attention (memory-bound): Llama-3-8B heads (Hq=32, Hkv=8, D=128) or Llama-3.2-1B
// heads (D=64), bf16, blocks of 16 tokens handed out in a shuffled order; bytes = the K and V rows
// read. batch 1 x 4096 takes the split (flash-decoding) path, batch 64 x 1024 fills the GPU without
// it, and batch 1 x 256 and 64 x 256 at D=64 are the 1B model's decode steps in zp_bench_generate
// (the first a latency, not a bandwidth).
Tensor dev_ints(const std::vector<int32_t>& h) {
  Tensor t = Tensor::empty({int64_t(h.size())}, DType::I32, Device::cuda(), "bench");
  ZP_CHECK(cudaMemcpy(t.data(), h.data(), h.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  return t;
}

void BM_PagedDecodeAttention(benchmark::State& st) {
  const int64_t batch = st.range(0), ctx = st.range(1), D = st.range(2), Hq = 32, Hkv = 8, bs = 16;
  const int64_t max_blocks = (ctx + bs - 1) / bs, num_blocks = batch * max_blocks;
  std::vector<int32_t> bt(static_cast<size_t>(num_blocks)), starts(static_cast<size_t>(batch + 1));
  std::vector<int32_t> lens(static_cast<size_t>(batch), static_cast<int32_t>(ctx));
  std::iota(bt.begin(), bt.end(), 0);
  std::shuffle(bt.begin(), bt.end(), std::mt19937(1));
  std::iota(starts.begin(), starts.end(), 0);
  Tensor g_bt = dev_ints(bt), g_lens = dev_ints(lens), g_starts = dev_ints(starts);
  Tensor kc = dev_rand(num_blocks * bs * Hkv * D, DType::BF16), vc = dev_rand(num_blocks * bs * Hkv * D, DType::BF16);
  Tensor q = dev_rand(batch * Hq * D, DType::BF16), o = dev_rand(batch * Hq * D, DType::BF16);
  const double kv_bytes = 2.0 * double(batch * ctx * Hkv * D) * 2;
  run(st, nullptr, 0, kv_bytes, [&] {
    cuda::paged_attention_forward(nullptr, DType::BF16, o.data(), q.data(), kc.data(), vc.data(),
                                  g_bt.data<int32_t>(), max_blocks, g_lens.data<int32_t>(), g_starts.data<int32_t>(),
                                  batch, batch, ctx, Hq, Hkv, D, bs, 0, 0, attention_default_scale(D));
  });
}
BENCHMARK(BM_PagedDecodeAttention)->ArgNames({"batch", "ctx", "D"})->Args({1, 4096, 128})->Args({64, 1024, 128})
    ->Args({1, 256, 64})->Args({64, 256, 64})
    ->UseManualTime()->Unit(benchmark::kMicrosecond);

// --- Norms (memory-bound): bytes = read x (+ dy) and write y (dx), bf16. Timed as queued launches
// (run's reps): each takes tens of microseconds or less.
constexpr int kQueuedReps = 20;
void BM_LayerNorm(benchmark::State& st) {
  int64_t N = st.range(0), C = st.range(1);
  bool backward = st.range(2);
  Tensor x = dev_rand(N * C, DType::BF16), y = dev_rand(N * C, DType::BF16), w = dev_rand(C, DType::BF16);
  Tensor b = dev_rand(C, DType::BF16), mean = Tensor::empty({N}, DType::F32, Device::cuda());
  Tensor rstd = Tensor::empty({N}, DType::F32, Device::cuda());
  Tensor dw = Tensor::zeros({C}, DType::F32, Device::cuda()), db = Tensor::zeros({C}, DType::F32, Device::cuda());
  cuda::layernorm_forward(nullptr, DType::BF16, y.data(), mean.data<float>(), rstd.data<float>(), x.data(), w.data(),
                          b.data(), N, C, 1e-5f);
  run(st, nullptr, 0, (backward ? 3.0 : 2.0) * N * C * 2, [&] {
    if (!backward)
      cuda::layernorm_forward(nullptr, DType::BF16, y.data(), mean.data<float>(), rstd.data<float>(), x.data(),
                              w.data(), b.data(), N, C, 1e-5f);
    else
      cuda::layernorm_backward(nullptr, DType::BF16, y.data(), dw.data<float>(), db.data<float>(), x.data(), x.data(),
                               w.data(), mean.data<float>(), rstd.data<float>(), N, C, false);
  }, kQueuedReps);
}
BENCHMARK(BM_LayerNorm)->ArgNames({"N", "C", "bwd"})->Args({32768, 768, 0})->Args({32768, 768, 1})
    ->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_RMSNorm(benchmark::State& st) {
  int64_t N = st.range(0), C = st.range(1);
  bool backward = st.range(2);
  Tensor x = dev_rand(N * C, DType::BF16), y = dev_rand(N * C, DType::BF16), w = dev_rand(C, DType::BF16);
  Tensor rstd = Tensor::empty({N}, DType::F32, Device::cuda());
  Tensor dw = Tensor::zeros({C}, DType::F32, Device::cuda());
  cuda::rmsnorm_forward(nullptr, DType::BF16, y.data(), rstd.data<float>(), x.data(), w.data(), N, C, 1e-6f);
  run(st, nullptr, 0, (backward ? 3.0 : 2.0) * N * C * 2, [&] {
    if (!backward)
      cuda::rmsnorm_forward(nullptr, DType::BF16, y.data(), rstd.data<float>(), x.data(), w.data(), N, C, 1e-6f);
    else
      cuda::rmsnorm_backward(nullptr, DType::BF16, y.data(), dw.data<float>(), x.data(), x.data(), w.data(),
                             rstd.data<float>(), N, C, false);
  }, kQueuedReps);
}
BENCHMARK(BM_RMSNorm)->ArgNames({"N", "C", "bwd"})->Args({16384, 2048, 0})->Args({16384, 2048, 1})
    ->UseManualTime()->Unit(benchmark::kMicrosecond);

// Channels-last x[N, HW, C], bf16, fused SiLU.
void BM_GroupNormSiLU(benchmark::State& st) {
  int64_t N = st.range(0), C = st.range(1), HW = st.range(2), G = 32;
  bool backward = st.range(3);
  Tensor x = dev_rand(N * C * HW, DType::BF16), y = dev_rand(N * C * HW, DType::BF16);
  Tensor w = dev_rand(C, DType::BF16), b = dev_rand(C, DType::BF16);
  Tensor mean = Tensor::empty({N * G}, DType::F32, Device::cuda()), rstd = Tensor::empty({N * G}, DType::F32, Device::cuda());
  Tensor dw = Tensor::zeros({C}, DType::F32, Device::cuda()), db = Tensor::zeros({C}, DType::F32, Device::cuda());
  cuda::groupnorm_forward(nullptr, DType::BF16, y.data(), mean.data<float>(), rstd.data<float>(), x.data(), w.data(),
                          b.data(), N, C, HW, G, 1e-5f, true);
  run(st, nullptr, 0, (backward ? 3.0 : 2.0) * N * C * HW * 2, [&] {
    if (!backward)
      cuda::groupnorm_forward(nullptr, DType::BF16, y.data(), mean.data<float>(), rstd.data<float>(), x.data(),
                              w.data(), b.data(), N, C, HW, G, 1e-5f, true);
    else
      cuda::groupnorm_backward(nullptr, DType::BF16, y.data(), dw.data<float>(), db.data<float>(), x.data(), x.data(),
                               w.data(), b.data(), mean.data<float>(), rstd.data<float>(), N, C, HW, G, true);
  }, kQueuedReps);
}
// SD 1.5 at B=8 (64x64, 32x32 and 16x16 latents' channels) and SDXL at B=2 (128x128).
BENCHMARK(BM_GroupNormSiLU)->ArgNames({"N", "C", "HW", "bwd"})
    ->ArgsProduct({{8}, {320}, {4096}, {0, 1}})->ArgsProduct({{8}, {640}, {1024}, {0, 1}})
    ->ArgsProduct({{8}, {1280}, {256}, {0, 1}})->ArgsProduct({{2}, {320}, {16384}, {0, 1}})
    ->UseManualTime()->Unit(benchmark::kMicrosecond);

// --- Conv2d (channels-last): the SD1.5 UNet's first-level 3x3 conv at B=8, 64x64 latents; forward and
// both grads.
void BM_Conv2d(benchmark::State& st) {
  Conv2dShape sh;
  sh.N = st.range(0); sh.Cin = st.range(1); sh.H = sh.W = st.range(2); sh.Cout = st.range(3);
  sh.KH = sh.KW = 3; sh.pad_h = sh.pad_w = 1;
  int which = int(st.range(4));  // 0 forward, 1 data grad, 2 filter grad
  Tensor x = dev_rand(sh.x_numel(), DType::BF16), w = dev_rand(sh.w_numel(), DType::BF16, 0.1f);
  Tensor y = dev_rand(sh.y_numel(), DType::BF16), bias = dev_rand(sh.Cout, DType::BF16);
  Tensor dw = Tensor::zeros({sh.w_numel()}, DType::F32, Device::cuda());
  Tensor db = Tensor::zeros({sh.Cout}, DType::F32, Device::cuda());
  double flops = 2.0 * sh.N * sh.Cout * sh.oh() * sh.ow() * sh.Cin * sh.KH * sh.KW;
  run(st, nullptr, flops, 0, [&] {
    if (which == 0) cuda::conv2d_forward(nullptr, DType::BF16, y.data(), x.data(), w.data(), bias.data(), sh);
    else if (which == 1) cuda::conv2d_backward_data(nullptr, DType::BF16, x.data(), y.data(), w.data(), sh);
    else cuda::conv2d_backward_filter(nullptr, DType::BF16, dw.data<float>(), db.data<float>(), y.data(), x.data(), sh);
  });
}
BENCHMARK(BM_Conv2d)->ArgNames({"N", "Cin", "HW", "Cout", "op"})
    ->Args({8, 320, 64, 320, 0})->Args({8, 320, 64, 320, 1})->Args({8, 320, 64, 320, 2})
    ->Args({8, 640, 32, 640, 0})->Args({8, 1280, 16, 1280, 0})->Args({8, 1280, 8, 1280, 0})  // SD 1.5's other levels
    ->UseManualTime()->Unit(benchmark::kMillisecond);

// --- Bias gradient (column sums of dy, fp32 accumulation): GPT-2's linears (N = 768, 2304, 3072 at
// B*T = 32768 rows) and an SD 1.5 convolution's (320 channels, 8 x 64 x 64 pixels). Reads dy once.
void BM_BiasGrad(benchmark::State& st) {
  int64_t M = st.range(0), N = st.range(1);
  Tensor dy = dev_rand(M * N, DType::BF16);
  Tensor db = Tensor::zeros({N}, DType::F32, Device::cuda());
  run(st, nullptr, 0, double(M) * N * 2, [&] { cuda::bias_grad(nullptr, DType::BF16, db.data<float>(), dy.data(), M, N); },
      kQueuedReps);
}
BENCHMARK(BM_BiasGrad)->ArgNames({"M", "N"})->Args({32768, 768})->Args({32768, 3072})->Args({32768, 320})
    ->UseManualTime()->Unit(benchmark::kMicrosecond);

// --- Cross-entropy over GPT-2's padded vocabulary: forward reads the logits, backward reads and writes them.
void BM_CrossEntropy(benchmark::State& st) {
  int64_t N = st.range(0), V = 50257, ld = 50304;
  bool backward = st.range(1);
  Tensor logits = dev_rand(N * ld, DType::BF16, 4.f);
  Tensor losses = Tensor::empty({N}, DType::F32, Device::cuda()), lse = Tensor::empty({N}, DType::F32, Device::cuda());
  std::vector<int32_t> ht(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) ht[size_t(i)] = int32_t((i * 7919) % V);
  Tensor targets = Tensor::empty({N}, DType::I32, Device::cuda());
  ZP_CHECK(cudaMemcpy(targets.data(), ht.data(), size_t(N) * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  cuda::cross_entropy_forward(nullptr, DType::BF16, losses.data<float>(), lse.data<float>(), logits.data(),
                              targets.data<int32_t>(), N, V, ld);
  run(st, nullptr, 0, (backward ? 2.0 : 1.0) * N * ld * 2, [&] {
    if (!backward)
      cuda::cross_entropy_forward(nullptr, DType::BF16, losses.data<float>(), lse.data<float>(), logits.data(),
                                  targets.data<int32_t>(), N, V, ld);
    else  // not in place, so every iteration sees the same logits
      cuda::cross_entropy_backward(nullptr, DType::BF16, logits.data(), logits.data(), lse.data<float>(),
                                   targets.data<int32_t>(), 1.f / float(N), N, V, ld);
  });
}
BENCHMARK(BM_CrossEntropy)->ArgNames({"N", "bwd"})->Args({32768, 0})->Args({32768, 1})
    ->UseManualTime()->Unit(benchmark::kMillisecond);

// --- Token sampling over Llama 3's vocabulary (128256, bf16): greedy (one pass over the logits) and
// top-p 0.9 at temperature 1 (radix-select passes and the draw). Bytes = the logits read once.
constexpr int64_t kLlama3Vocab = 128256;

// Times cuda::sample_tokens over the rows of `logits` (bf16 [S, kLlama3Vocab]) with params `hp`.
void time_sampling(benchmark::State& st, const Tensor& logits, const std::vector<SamplingParams>& hp) {
  const int64_t S = int64_t(hp.size()), V = kLlama3Vocab;
  Tensor params = Tensor::empty({S * int64_t(sizeof(SamplingParams))}, DType::U8, Device::cuda(), "bench");
  ZP_CHECK(cudaMemcpy(params.data(), hp.data(), hp.size() * sizeof(SamplingParams), cudaMemcpyHostToDevice) ==
           cudaSuccess);
  Tensor tokens = Tensor::empty({S}, DType::I32, Device::cuda(), "bench");
  auto* p = static_cast<const SamplingParams*>(params.data());
  run(st, nullptr, 0, double(S) * V * 2, [&] {
    cuda::sample_tokens(nullptr, DType::BF16, tokens.data<int32_t>(), nullptr, logits.data(), S, V, V, p, nullptr,
                        nullptr);
  });
}

void BM_SampleTokens(benchmark::State& st) {
  const int64_t S = st.range(0);
  const bool top_p = st.range(1);
  std::vector<SamplingParams> hp(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) {
    if (top_p) hp[size_t(i)].temperature = 1.f, hp[size_t(i)].top_p = 0.9f;
    hp[size_t(i)].seed = uint64_t(i);
  }
  time_sampling(st, dev_rand(S * kLlama3Vocab, DType::BF16, 8.f), hp);
}
BENCHMARK(BM_SampleTokens)->ArgNames({"S", "top_p"})
    ->Args({1, 0})->Args({64, 0})->Args({64, 1})->Args({256, 0})->Args({256, 1})
    ->UseManualTime()->Unit(benchmark::kMicrosecond);

// --- Top-p over Llama 3's vocabulary (128256, bf16) at batch 64, by top_p (in thousandths), on two
// distributions: "peaked" (normal logits of scale 3: a language model's few hundred plausible tokens)
// and "flat" (uniform in [-4, 4): tens of thousands kept). The CUDA sampler selects thresholds by
// radix passes (no sort at any top_p); bytes = the logits read once.
std::vector<float> top_p_logits(int64_t n, bool peaked) {
  std::mt19937_64 g(7);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::uniform_real_distribution<float> flat(-4.f, 4.f);
  std::vector<float> h(static_cast<size_t>(n));
  for (auto& v : h) v = peaked ? normal(g) : flat(g);
  return h;
}

void BM_TopP(benchmark::State& st) {
  const int64_t S = st.range(0), n = S * kLlama3Vocab;
  const std::vector<float> h = top_p_logits(n, st.range(2) != 0);
  Tensor f = Tensor::empty({n}, DType::F32, Device::cuda(), "bench");
  ZP_CHECK(cudaMemcpy(f.data(), h.data(), h.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  Tensor logits = Tensor::empty({n}, DType::BF16, Device::cuda(), "bench");
  cuda::cast(nullptr, DType::BF16, logits.data(), DType::F32, f.data(), n);
  std::vector<SamplingParams> hp(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) {
    hp[size_t(i)].temperature = 1.f;
    hp[size_t(i)].top_p = float(st.range(1)) / 1000.f;
    hp[size_t(i)].seed = uint64_t(i);
  }
  time_sampling(st, logits, hp);
}
BENCHMARK(BM_TopP)->ArgNames({"S", "top_p", "peaked"})
    ->Args({64, 500, 1})->Args({64, 900, 1})->Args({64, 999, 1})->Args({64, 900, 0})->Args({64, 999, 0})
    ->UseManualTime()->Unit(benchmark::kMicrosecond);

// The CPU reference's top-p threshold for one row (host time): the heaviest kTopPCandidates sorted
// first (candidates = 1) against the whole vocabulary sorted (candidates = 0, the CPU before).
void BM_TopPCpu(benchmark::State& st) {
  const int64_t V = kLlama3Vocab;
  const int64_t candidates = st.range(0) ? kTopPCandidates : V;
  const float top_p = float(st.range(1)) / 1000.f;
  const std::vector<float> l = top_p_logits(V, st.range(2) != 0);
  const float mx = *std::max_element(l.begin(), l.end());
  std::vector<double> w(l.size());
  double z = 0;
  for (size_t c = 0; c < l.size(); ++c) z += w[c] = std::exp(double(l[c]) - mx);
  for (auto _ : st) benchmark::DoNotOptimize(cpu::top_p_threshold(w, z, top_p, candidates));
}
BENCHMARK(BM_TopPCpu)->ArgNames({"candidates", "top_p", "peaked"})
    ->Args({1, 900, 1})->Args({0, 900, 1})->Args({1, 999, 1})->Args({0, 999, 1})->Args({1, 900, 0})->Args({0, 900, 0})
    ->Unit(benchmark::kMicrosecond);

// --- AdamW over GPT-2 124M's parameters in 148 tensors (fp32 master, moments, bf16 copy).
void BM_AdamW(benchmark::State& st) {
  int64_t total = st.range(0), count = st.range(1), each = total / count;
  Tensor p = dev_rand(total, DType::F32), g = dev_rand(total, DType::F32), m = dev_rand(total, DType::F32, 0.01f);
  Tensor v = dev_rand(total, DType::F32, 0.001f), copy = dev_rand(total, DType::BF16);
  cuda::scale(nullptr, DType::F32, v.data(), v.data(), 0.f, total);  // second moments must be >= 0
  std::vector<AdamWTensor> ts(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    ts[size_t(i)] = {p.data<float>() + i * each, g.data<float>() + i * each, m.data<float>() + i * each,
                     v.data<float>() + i * each, static_cast<bf16*>(copy.data()) + i * each, each, 0.1f};
  }
  AdamWConfig cfg;
  // read p, g, m, v; write p, m, v, copy
  run(st, nullptr, 0, double(total) * (4 * 4 + 3 * 4 + 2), [&] {
    cfg.step++;
    cuda::adamw_step(nullptr, ts.data(), int(count), cfg, DType::BF16);
  });
}
BENCHMARK(BM_AdamW)->ArgNames({"params", "tensors"})->Args({124439808, 148})
    ->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace zp::bench

int main(int argc, char** argv) {
  return zp::bench::run_gpu_benchmarks(argc, argv, "zp_bench_kernels", [] {
    return zp::bench::ContextPairs{{"peak_dram_GBs", std::to_string(zp::bench::device_peak().gbs)}};
  });
}
