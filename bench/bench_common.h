// Shared by the GPU benchmarks: timing with CUDA events, memory peaks, benchmark weights, and main().
#pragma once
#include <benchmark/benchmark.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <functional>
#include <random>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/tensor.h"
#include "kernels/elementwise.h"
#include "nn/parameter.h"

namespace zp::bench {

// Runs `step` once to warm up (plans, workspaces, the allocator's pool), then `after_warmup`, then
// times each benchmark iteration with CUDA events on `s` as manual time. Returns the mean seconds
// per iteration. `reps` > 1 runs `step` that many times between the events and counts the time of
// one: for kernels of a few microseconds, where one launch alone also times the host's launch (the
// device idles until it arrives), while a training step queues its launches ahead of the device.
// With ZP_BENCH_PROFILE=1 the process's first timed iteration runs between cudaProfilerStart and
// cudaProfilerStop, so `ncu --profile-from-start off` sees one steady-state step's kernels and not
// the warm-up's (plan searches, first-touch allocations) or the set-up's.
inline double timed_iterations(benchmark::State& st, StreamHandle s, const std::function<void()>& step,
                               const std::function<void()>& after_warmup = {}, int reps = 1) {
  static bool profile_pending = [] {
    const char* e = std::getenv("ZP_BENCH_PROFILE");
    return e && std::string(e) == "1";
  }();
  step();
  stream_synchronize(s);
  if (after_warmup) after_warmup();
  Event a, b;
  double total_ms = 0;
  for (auto _ : st) {
    const bool profiled = profile_pending;
    if (profiled) cudaProfilerStart();
    a.record(s);
    for (int i = 0; i < reps; ++i) step();
    b.record(s);
    b.synchronize();
    if (profiled) {
      cudaProfilerStop();
      profile_pending = false;
    }
    const double ms = b.elapsed_ms_since(a) / reps;
    total_ms += ms;
    st.SetIterationTime(ms / 1e3);
  }
  return total_ms / 1e3 / double(st.iterations());
}

// Peak memory of one benchmark on GPU 0, in GiB: the engine allocator's peak (what
// torch.cuda.max_memory_allocated measures) and everything the process holds on the device, library
// workspaces included, sampled with sample() (after each step). The constructor gives back what an
// earlier benchmark left cached in the pool, so both peaks are this one's.
class MemoryPeaks {
 public:
  MemoryPeaks() {
    cudaDeviceSynchronize();
    cudaMemPool_t pool = nullptr;
    cudaDeviceGetDefaultMemPool(&pool, 0);
    cudaMemPoolTrimTo(pool, 0);
    size_t total = 0;
    cudaMemGetInfo(&free0_, &total);
    min_free_ = free0_;
    device_allocator(0).reset_peak();
  }
  void sample() {
    size_t f = 0, total = 0;
    cudaMemGetInfo(&f, &total);
    min_free_ = std::min(min_free_, f);
  }
  double engine_gib() const { return double(device_allocator(0).stats().peak) / double(1ull << 30); }
  double device_gib() const { return double(free0_ - min_free_) / double(1ull << 30); }

 private:
  size_t free0_ = 0, min_free_ = 0;
};

// Every block's compute buffer filled by tiling one block of Normal(0, 0.02) values. Weight values do
// not change kernel timings, and the engine's counter-based initialisation of billions of values on
// the host would dominate a benchmark's run time.
inline void fill_blocks_random(const std::vector<nn::ParamBlock*>& blocks, Device dev, StreamHandle s) {
  const int64_t tile = 1 << 22;
  std::mt19937 g(1);
  std::normal_distribution<float> d(0.f, 0.02f);
  Tensor h = Tensor::empty({tile}, DType::F32, Device::cpu());
  for (int64_t i = 0; i < tile; ++i) h.data<float>()[i] = d(g);
  Tensor f = h.to(dev, s);
  for (nn::ParamBlock* blk : blocks) {
    Tensor b = Tensor::empty({tile}, blk->dtype(), dev, "bench", s);
    kernels::cuda::cast(s, blk->dtype(), b.data(), DType::F32, f.data(), tile);
    for (int64_t o = 0; o < blk->padded(); o += tile) {
      const int64_t n = std::min(tile, blk->padded() - o);
      blk->values().flat(o, n).copy_from(b.flat(0, n), s);
    }
  }
}

// main() of a one-GPU benchmark binary: refuses to run without a GPU (exit 1, saying why), records
// the device and its dense bf16 peak (and what `extra` adds, asked once the GPU is known to exist)
// in the output, runs the benchmarks.
using ContextPairs = std::vector<std::pair<std::string, std::string>>;
inline int run_gpu_benchmarks(int argc, char** argv, const char* name,
                              const std::function<ContextPairs()>& extra = {}) {
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "%s: %s\n", name, cuda_unavailable_reason().c_str());
    return 1;
  }
  benchmark::AddCustomContext("device", cuda_device_name(0));
  benchmark::AddCustomContext("peak_bf16_dense_TFLOPs", std::to_string(cuda_peak_bf16_tflops(0)));
  if (extra)
    for (const auto& [k, v] : extra()) benchmark::AddCustomContext(k, v);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace zp::bench
