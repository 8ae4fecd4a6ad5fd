// Offload-tier benchmarks (issue 11), Google Benchmark JSON with `--benchmark_format=json`.
//
// CPU part (built with or without CUDA): the vectorised host AdamW against the memory bandwidth of the
// same machine, measured in the same run by a STREAM triad on the same number of threads.
//   BM_Triad/<threads>/nt:<0|1>   a = b + s * c over arrays far larger than the last-level cache; GB/s
//                                 counts 12 bytes per element, as STREAM does. With nt:1 the stores
//                                 bypass the cache, so the count is the real traffic; with nt:0 each
//                                 store also reads its line first (uncounted), as STREAM's usual build.
//   BM_HostAdamW/<isa>/<threads>  one step over --params fp32 parameters (default 256M) with a bf16 copy:
//                                 params/s, GB/s (reads p, g, m, v; writes p, m, v and the copy: 30 bytes
//                                 per parameter), and pct_of_triad: the best step's GB/s over the best
//                                 of an nt:1 triad pass run on the same pool after every step.
// The target is pct_of_triad >= 80. `zp_bench_offload [--params N] [benchmark flags]`.
// GPU benchmarks of the offload engine belong in this file too, inside #ifdef ZP_WITH_CUDA (they use
// bench_common.h, which needs the CUDA runtime), so the CPU part keeps building without CUDA.
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kernels/host/host_adamw.h"

namespace zp::bench {
using kernels::host::HostAdamW;
using kernels::host::Isa;
using kernels::host::ThreadPool;

int64_t g_params = int64_t(256) << 20;
constexpr int64_t kTriadElems = int64_t(64) << 20;  // 256 MiB per array

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <class T> using Buffer = std::unique_ptr<T[], FreeDeleter>;
template <class T> Buffer<T> alloc(int64_t n) {
  const size_t bytes = (size_t(n) * sizeof(T) + 63) / 64 * 64;
  return Buffer<T>(static_cast<T*>(std::aligned_alloc(64, bytes)));
}

// Worker w's share [begin, end) of n elements, in whole 64-byte lines so streaming stores stay aligned.
std::pair<int64_t, int64_t> share(int64_t n, int w, int workers) {
  const int64_t lines = (n + 15) / 16;
  const int64_t b = lines * w / workers * 16, e = lines * (w + 1) / workers * 16;
  return {std::min(b, n), std::min(e, n)};
}

// ---- triad ----

__attribute__((target("avx2"))) void triad_avx2(float* a, const float* b, const float* c, float s, int64_t n,
                                                bool nt) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_add_ps(_mm256_load_ps(b + i), _mm256_mul_ps(vs, _mm256_load_ps(c + i)));
    if (nt) _mm256_stream_ps(a + i, x);
    else _mm256_store_ps(a + i, x);
  }
  for (; i < n; ++i) a[i] = b[i] + s * c[i];
}

void triad_sse(float* a, const float* b, const float* c, float s, int64_t n, bool nt) {
  const __m128 vs = _mm_set1_ps(s);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m128 x = _mm_add_ps(_mm_load_ps(b + i), _mm_mul_ps(vs, _mm_load_ps(c + i)));
    if (nt) _mm_stream_ps(a + i, x);
    else _mm_store_ps(a + i, x);
  }
  for (; i < n; ++i) a[i] = b[i] + s * c[i];
}

struct TriadArrays {
  Buffer<float> a = alloc<float>(kTriadElems), b = alloc<float>(kTriadElems), c = alloc<float>(kTriadElems);
};

// Seconds of one triad pass on the pool (each worker its own contiguous share, as first touched).
double triad_once(ThreadPool& pool, TriadArrays& t, bool nt) {
  const bool avx2 = __builtin_cpu_supports("avx2");
  const auto t0 = std::chrono::steady_clock::now();
  pool.run([&](int w) {
    auto [b, e] = share(kTriadElems, w, pool.size());
    if (avx2) triad_avx2(t.a.get() + b, t.b.get() + b, t.c.get() + b, 3.f, e - b, nt);
    else triad_sse(t.a.get() + b, t.b.get() + b, t.c.get() + b, 3.f, e - b, nt);
    if (nt) _mm_sfence();
  });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TriadArrays& triad_arrays(ThreadPool& pool) {
  static TriadArrays t;
  static bool touched = false;
  if (!touched) {  // first touch by the workers that will use each share
    pool.run([&](int w) {
      auto [b, e] = share(kTriadElems, w, pool.size());
      for (int64_t i = b; i < e; ++i) t.a[i] = 0.f, t.b[i] = 1.f, t.c[i] = 2.f;
    });
    touched = true;
  }
  return t;
}

void BM_Triad(benchmark::State& st, int threads, bool nt) {
  ThreadPool pool(threads);
  TriadArrays& t = triad_arrays(pool);
  triad_once(pool, t, nt);
  double secs = 0, best = 1e30;
  for (auto _ : st) {
    const double s = triad_once(pool, t, nt);
    secs += s;
    best = std::min(best, s);
    st.SetIterationTime(s);
  }
  st.counters["GB/s"] = 12.0 * double(kTriadElems) * double(st.iterations()) / secs / 1e9;
  st.counters["best_GB/s"] = 12.0 * double(kTriadElems) / best / 1e9;
}

// ---- host AdamW ----

struct AdamWArrays {
  int64_t n;
  Buffer<float> p, g, m, v;
  Buffer<uint16_t> copy;
  explicit AdamWArrays(int64_t n_)
      : n(n_), p(alloc<float>(n)), g(alloc<float>(n)), m(alloc<float>(n)), v(alloc<float>(n)),
        copy(alloc<uint16_t>(n)) {}
};

AdamWArrays& adamw_arrays(ThreadPool& pool) {
  static AdamWArrays a(g_params);
  static bool touched = false;
  if (!touched) {
    pool.run([&](int w) {
      auto [b, e] = share(a.n, w, pool.size());
      for (int64_t i = b; i < e; ++i) {
        a.p[i] = 0.02f * float(i % 1001 - 500) / 500.f;
        a.g[i] = 1e-3f * float(i % 997 - 498) / 498.f;
        a.m[i] = 0.f, a.v[i] = 0.f, a.copy[i] = 0;
      }
    });
    touched = true;
  }
  return a;
}

void BM_HostAdamW(benchmark::State& st, Isa isa, int threads) {
  HostAdamW opt(threads);
  AdamWArrays& a = adamw_arrays(opt.pool());
  // Tensors of 16M parameters, like the weight matrices of a block.
  std::vector<kernels::AdamWTensor> ts;
  for (int64_t o = 0; o < a.n; o += int64_t(16) << 20) {
    const int64_t len = std::min(a.n - o, int64_t(16) << 20);
    ts.push_back({a.p.get() + o, a.g.get() + o, a.m.get() + o, a.v.get() + o, a.copy.get() + o, len, 0.01f});
  }
  kernels::AdamWConfig cfg;
  cfg.lr = 1e-4;
  opt.step(ts.data(), int(ts.size()), cfg, DType::BF16, isa);
  // A triad pass after every step, outside the timed region, and the best of each over the iterations
  // (STREAM's convention): a busy or virtual machine that takes the CPU away mid-pass hurts the short
  // triad pass more than the long step, and the best times are the ones it left alone.
  TriadArrays& tri = triad_arrays(opt.pool());
  double secs = 0, best = 1e30, best_triad = 1e30;
  for (auto _ : st) {
    ++cfg.step;
    const auto t0 = std::chrono::steady_clock::now();
    opt.step(ts.data(), int(ts.size()), cfg, DType::BF16, isa);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    secs += s;
    best = std::min(best, s);
    st.SetIterationTime(s);
    best_triad = std::min(best_triad, triad_once(opt.pool(), tri, true));
  }
  const double bytes = 30.0 * double(a.n);
  const double triad = 12.0 * double(kTriadElems) / best_triad / 1e9;
  st.counters["params/s"] = double(a.n) * double(st.iterations()) / secs;
  st.counters["GB/s"] = bytes * double(st.iterations()) / secs / 1e9;
  st.counters["best_GB/s"] = bytes / best / 1e9;
  st.counters["triad_GB/s"] = triad;
  st.counters["pct_of_triad"] = 100.0 * bytes / best / 1e9 / triad;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

}  // namespace zp::bench

int main(int argc, char** argv) {
  using namespace zp::bench;
  std::vector<char*> args;  // ours removed, the rest for Google Benchmark
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--params") == 0 && i + 1 < argc) {
      g_params = std::stoll(argv[++i]);
      continue;
    }
    args.push_back(argv[i]);
  }
  int nargs = int(args.size());
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<int> thread_counts;
  for (int t = 1; t < hw; t *= 2) thread_counts.push_back(t);
  thread_counts.push_back(hw);

  std::string isas;
  for (Isa isa : zp::kernels::host::supported_isas()) isas += std::string(isas.empty() ? "" : ",") + isa_name(isa);
  benchmark::AddCustomContext("cpu", cpu_model());
  benchmark::AddCustomContext("hardware_threads", std::to_string(hw));
  benchmark::AddCustomContext("host_adamw_isas", isas);
  benchmark::AddCustomContext("host_adamw_params", std::to_string(g_params));
  for (int t : thread_counts)
    for (bool nt : {true, false})
      benchmark::RegisterBenchmark(("BM_Triad/" + std::to_string(t) + "/nt:" + (nt ? "1" : "0")).c_str(),
                                   BM_Triad, t, nt)
          ->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);
  for (Isa isa : zp::kernels::host::supported_isas())
    for (int t : thread_counts)
      benchmark::RegisterBenchmark(("BM_HostAdamW/" + std::string(isa_name(isa)) + "/" + std::to_string(t)).c_str(),
                                   BM_HostAdamW, isa, t)
          ->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(3.0);
  benchmark::Initialize(&nargs, args.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
