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
// The target is pct_of_triad >= 80.
//   BM_RawDirect/<write|read>     a sequential O_DIRECT pass over a file of --nvme-bytes (default 1 GiB) in
//                                 the directory $ZP_BENCH_NVME_DIR (default /tmp), 64 MiB per pwrite/pread
//                                 from one aligned buffer: what the disk gives a plain program; GB/s.
//   BM_NvmeSwap/<write|read>/block_KiB:<b>/queue_depth:<q>
//                                 the same bytes through the NVMe tier's swap file (io::NvmeSwapFile:
//                                 io_uring, aio.block_size pieces, aio.queue_depth in flight; the config's
//                                 defaults 1 MiB and 8, and 4 MiB and 32): GB/s, and pct_of_raw: its best
//                                 pass over the best of a raw pass run after every one. The issue's
//                                 target is pct_of_raw >= 90.
// `zp_bench_offload [--params N] [--nvme-bytes N] [benchmark flags]`.
// GPU part (CUDA builds, inside #ifdef ZP_WITH_CUDA so the CPU part builds without CUDA): the offload
// engine on the 1.42B GPT, BM_OffloadStep below.
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "core/error.h"
#include "io/nvme_swap_file.h"
#include "kernels/host/host_adamw.h"
#include "quiet_reporter.h"
#ifdef ZP_WITH_CUDA
#include <cmath>
#include <random>

#include "bench_common.h"
#include "comm/bootstrap.h"
#include "comm/topology.h"
#include "core/allocator.h"
#include "core/cpu_share.h"
#include "models/transformer.h"
#include "parallel/zero_engine.h"
#include "runtime/causal_lm_loss.h"
#endif

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

int64_t g_nvme_bytes = int64_t(1) << 30;

std::string nvme_dir() {
  const char* d = std::getenv("ZP_BENCH_NVME_DIR");
  return d && *d ? d : "/tmp";
}

// The I/O buffer both NVMe benchmarks move from and to: 256 MiB, page aligned, filled once.
constexpr int64_t kIoBuffer = int64_t(256) << 20;
char* io_buffer() {
  static Buffer<char> b = [] {
    Buffer<char> p(static_cast<char*>(std::aligned_alloc(size_t(io::NvmeSwapFile::kAlign), size_t(kIoBuffer))));
    for (int64_t i = 0; i < kIoBuffer; ++i) p[i] = char(i * 131 + 7);
    return p;
  }();
  return b.get();
}

// A plain program's sequential O_DIRECT pass: pwrite/pread of 64 MiB at a time, one after another.
class RawDirectFile {
 public:
  explicit RawDirectFile(int64_t bytes) : bytes_(bytes) {
    const std::string path = nvme_dir() + "/zp_bench_raw_" + std::to_string(::getpid());
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
    if (fd_ < 0) throw Error(path + ": cannot open with O_DIRECT: " + std::strerror(errno));
    ::unlink(path.c_str());
    if (::fallocate(fd_, 0, 0, bytes) != 0) throw Error(path + ": cannot preallocate: " + std::strerror(errno));
  }
  ~RawDirectFile() { ::close(fd_); }
  // Seconds for one pass.
  double pass(bool write) {
    constexpr int64_t kCall = int64_t(64) << 20;
    char* buf = io_buffer();
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t off = 0; off < bytes_; off += kCall) {
      const size_t n = size_t(std::min(kCall, bytes_ - off));
      char* at = buf + off % kIoBuffer;
      const ssize_t done = write ? ::pwrite(fd_, at, n, off) : ::pread(fd_, at, n, off);
      if (done != ssize_t(n)) throw Error(std::string("raw O_DIRECT ") + (write ? "write" : "read") + " failed: " +
                                          std::strerror(errno));
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  int fd_ = -1;
  int64_t bytes_ = 0;
};

// One pass through the swap file: every 64 MiB request submitted at once, then all waited for.
double swap_pass(io::NvmeSwapFile& f, int64_t bytes, bool write) {
  constexpr int64_t kRequest = int64_t(64) << 20;
  char* buf = io_buffer();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t off = 0; off < bytes; off += kRequest) {
    const int64_t n = std::min(kRequest, bytes - off);
    if (write)
      f.write(off, buf + off % kIoBuffer, n);
    else
      f.read(off, buf + off % kIoBuffer, n);
  }
  f.wait_all();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void BM_RawDirect(benchmark::State& st, bool write) {
  try {
    RawDirectFile raw(g_nvme_bytes);
    if (!write) raw.pass(true);  // something to read
    double best = 1e30, total = 0;
    for (auto _ : st) {
      const double s = raw.pass(write);
      best = std::min(best, s);
      total += s;
      st.SetIterationTime(s);
    }
    st.counters["GB/s"] = double(g_nvme_bytes) * double(st.iterations()) / total / 1e9;
    st.counters["best_GB/s"] = double(g_nvme_bytes) / best / 1e9;
  } catch (const Error& e) {
    st.SkipWithError(e.what());
  }
}

void BM_NvmeSwap(benchmark::State& st, bool write, int64_t block_size, int queue_depth) {
  try {
    io::NvmeSwapFile f(nvme_dir(), "ZP_BENCH_NVME_DIR", "zp_bench_swap_" + std::to_string(::getpid()), g_nvme_bytes,
                       block_size, queue_depth);
    RawDirectFile raw(g_nvme_bytes);
    if (!write) {
      swap_pass(f, g_nvme_bytes, true);
      raw.pass(true);
    }
    double best = 1e30, best_raw = 1e30, total = 0;
    for (auto _ : st) {
      const double s = swap_pass(f, g_nvme_bytes, write);
      best = std::min(best, s);
      total += s;
      st.SetIterationTime(s);
      st.PauseTiming();
      best_raw = std::min(best_raw, raw.pass(write));
      st.ResumeTiming();
    }
    st.counters["GB/s"] = double(g_nvme_bytes) * double(st.iterations()) / total / 1e9;
    st.counters["best_GB/s"] = double(g_nvme_bytes) / best / 1e9;
    st.counters["raw_GB/s"] = double(g_nvme_bytes) / best_raw / 1e9;
    st.counters["pct_of_raw"] = 100.0 * best_raw / best;
    st.counters["direct"] = f.direct() ? 1 : 0;
  } catch (const Error& e) {
    st.SkipWithError(e.what());
  }
}

#ifdef ZP_WITH_CUDA
// GPU part, run under `mpirun -np 1` (and -np 2): one training step per iteration at ZeRO stage 3
// with the optimizer state on the device (offload:0), in pinned host memory with AdamW on the CPU
// (offload:1), or that and the parameter shards in pinned host memory too (offload:2), one optimizer
// step per `accum` micro-batches, clipping on. Counters: tokens/s over all ranks, GPU peak (engine
// allocator), host peak RSS, and on offloaded rows fraction_of_non_offloaded: the offload:0 row's step
// time (same stage and accum, run earlier in the same process: keep it in the filter) over this row's.
// The target for the delayed update is fraction_of_non_offloaded >= 0.85 at accum 8.
//   BM_OffloadStep/stage/offload/accum   the 1.42B GPT of zp_bench_zero (d=2048, 24 layers, B=8,
//                                        T=1024 per GPU, bf16 compute)
//   BM_OffloadStepDelayed/stage/offload/accum   the same with the one-step delayed update
//                                        (zero_optimization.offload_optimizer.delayed_update): the CPU
//                                        AdamW of step s overlaps step s+1 (parallel/delayed_update.h)
//   BM_OffloadStepRatio/stage/offload/accum/ratio_pct   the same with zero_optimization.offload_optimizer.ratio
//                                        = ratio_pct / 100: the rest of the optimizer state stays on the
//                                        GPU, which updates it while the CPU updates the offloaded part
//   BM_OffloadLlama7B/offload            a Llama-shaped 7B (d=4096, 32 layers, ffn 11008), B=4,
//                                        T=1024, activation checkpointing: it does not fit one 80 GB
//                                        GPU without offload (18 bytes per parameter: 126 GB)
comm::Runtime* g_rt = nullptr;
// Seconds per step of the offload:0 rows that ran, by (stage, accum): the offloaded rows' reference.
std::map<std::pair<int, int64_t>, double> g_on_device_step_s;

void run_offload_step(benchmark::State& st, const nlohmann::json& hub, int stage, int offload, int64_t accum,
                      int64_t B, int64_t T, bool checkpoint, bool delayed = false, double ratio = 1.0) {
  if (!g_rt || !g_rt->device().is_cuda()) {
    st.SkipWithError("needs a GPU");
    return;
  }
  comm::Runtime& rt = *g_rt;
  const int world = rt.world_size();
  std::unique_ptr<comm::Communicator> dp;
  if (world > 1) dp = comm::make_communicator(comm::Backend::Nccl, rt.world());
  auto cfg = models::TransformerConfig::from_hub_json(hub, "bench");
  Stream stream(rt.device());
  const StreamHandle s = stream.handle();
  cudaDeviceSynchronize();
  Allocator& dev_alloc = device_allocator(rt.device().index);
  dev_alloc.reset_peak();
  const size_t before = dev_alloc.stats().current;
  double tok_s = 0;
  {
    models::Transformer model(cfg, rt.device(), DType::BF16, s, parallel::shard_pad_multiple(world));
    fill_blocks_random(model.blocks(), rt.device(), s);
    parallel::AdamWHyper hyper{3e-4, 0.9, 0.95, 1e-8, 0.1, false};
    parallel::ShardingPolicy policy =
        parallel::ShardingPolicy::from_config(stage, offload >= 1 ? "cpu" : "none", offload >= 2 ? "cpu" : "none");
    // As the training driver does: the rank's share of the node's CPUs, whatever mpirun bound it to.
    const CpuShare share = take_cpu_share(rt.local_rank(), rt.local_size());
    if (!share.note.empty() && rt.rank() == 0) std::fprintf(stderr, "%s\n", share.note.c_str());
    policy.set_host_threads(int(share.cpus.size()));
    policy.set_delayed_update(delayed);
    policy.set_offload_ratio(ratio);
    parallel::ZeroEngine engine(model.blocks(), policy, dp.get(), hyper, s);
    model.set_block_access(&engine);
    std::mt19937 g(uint32_t(rt.rank() + 1));
    Tensor ids_h = Tensor::empty({B * T}, DType::I32, Device::cpu());
    for (int64_t i = 0; i < B * T; ++i) ids_h.data<int32_t>()[i] = int32_t(g() % uint32_t(cfg.vocab));
    Tensor ids = ids_h.to(rt.device(), s);
    const models::ForwardMode mode = checkpoint ? models::ForwardMode::TrainCheckpointed : models::ForwardMode::Train;
    auto step = [&] {
      engine.begin_step();
      for (int64_t m = 0; m < accum; ++m) {
        engine.begin_micro_step(m + 1 == accum);
        models::TransformerActivations acts;
        model.forward(ids.data<int32_t>(), B, T, acts, mode);
        runtime::CausalLmLoss loss(acts.logits, cfg.vocab, ids.data<int32_t>(), B * T, s);
        model.backward(acts, loss.backward(acts.logits, 1.f / float(accum)));
      }
      engine.finish_gradients();
      const double norm = std::sqrt(engine.grad_norm_squared());
      engine.step(float(norm > 1.0 ? 1.0 / norm : 1.0));
    };
    // With the delayed update a step waits for the previous one's CPU update on the host, so the
    // events around a step count that wait too: the time per step in the steady state.
    const double secs = timed_iterations(st, s, step);
    tok_s = double(world * accum * B * T) / secs;
    if (offload == 0 && !checkpoint) g_on_device_step_s[{stage, accum}] = secs;
    const auto on_device = g_on_device_step_s.find({stage, accum});
    if (offload > 0 && !checkpoint && on_device != g_on_device_step_s.end())
      st.counters["fraction_of_non_offloaded"] = on_device->second / secs;
  }  // the engine waits for the update in flight
  st.counters["world"] = world;
  st.counters["tokens_per_s"] = tok_s;
  st.counters["tokens_per_s_per_gpu"] = tok_s / world;
  st.counters["peak_engine_GiB_rank0"] = double(dev_alloc.stats().peak - before) / double(1ull << 30);
  st.counters["host_peak_rss_GiB_rank0"] = host_peak_rss_bytes() / double(1ull << 30);
}

void BM_OffloadStep(benchmark::State& st) {
  const nlohmann::json hub = {{"model_type", "gpt2"}, {"vocab_size", 50304}, {"n_positions", 1024}, {"n_embd", 2048},
                              {"n_layer", 24}, {"n_head", 16}};
  run_offload_step(st, hub, int(st.range(0)), int(st.range(1)), st.range(2), 8, 1024, false);
}
BENCHMARK(BM_OffloadStep)->ArgNames({"stage", "offload", "accum"})->ArgsProduct({{3}, {0, 1, 2}, {1, 8}})
    ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);

void BM_OffloadStepDelayed(benchmark::State& st) {
  const nlohmann::json hub = {{"model_type", "gpt2"}, {"vocab_size", 50304}, {"n_positions", 1024}, {"n_embd", 2048},
                              {"n_layer", 24}, {"n_head", 16}};
  run_offload_step(st, hub, int(st.range(0)), int(st.range(1)), st.range(2), 8, 1024, false, /*delayed=*/true);
}
// Registered after BM_OffloadStep, whose offload:0 rows it is measured against.
BENCHMARK(BM_OffloadStepDelayed)->ArgNames({"stage", "offload", "accum"})->ArgsProduct({{3}, {1, 2}, {1, 8}})
    ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);

void BM_OffloadStepRatio(benchmark::State& st) {
  const nlohmann::json hub = {{"model_type", "gpt2"}, {"vocab_size", 50304}, {"n_positions", 1024}, {"n_embd", 2048},
                              {"n_layer", 24}, {"n_head", 16}};
  run_offload_step(st, hub, int(st.range(0)), int(st.range(1)), st.range(2), 8, 1024, false, false,
                   double(st.range(3)) / 100.0);
}
// Registered after BM_OffloadStep, whose offload:0 rows it is measured against.
BENCHMARK(BM_OffloadStepRatio)->ArgNames({"stage", "offload", "accum", "ratio_pct"})
    ->ArgsProduct({{3}, {1, 2}, {1, 8}, {50, 60}})->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);

void BM_OffloadLlama7B(benchmark::State& st) {
  const nlohmann::json hub = {{"model_type", "llama"}, {"vocab_size", 32000}, {"hidden_size", 4096},
                              {"intermediate_size", 11008}, {"num_hidden_layers", 32}, {"num_attention_heads", 32},
                              {"num_key_value_heads", 32}, {"max_position_embeddings", 4096}};
  run_offload_step(st, hub, 3, int(st.range(0)), 1, 4, 1024, true);
}
BENCHMARK(BM_OffloadLlama7B)->ArgNames({"offload"})->Arg(1)->Arg(2)->UseManualTime()->Unit(benchmark::kMillisecond)
    ->Iterations(2);

#endif  // ZP_WITH_CUDA

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
    if (std::strcmp(argv[i], "--nvme-bytes") == 0 && i + 1 < argc) {
      // Whole pages: O_DIRECT moves nothing smaller.
      const int64_t page = zp::io::NvmeSwapFile::kAlign;
      g_nvme_bytes = std::max<int64_t>(page, std::stoll(argv[++i]) / page * page);
      continue;
    }
    args.push_back(argv[i]);
  }
  int nargs = int(args.size());
  args.push_back(nullptr);  // argv's terminator
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
  benchmark::AddCustomContext("nvme_dir", nvme_dir());
  benchmark::AddCustomContext("nvme_bytes", std::to_string(g_nvme_bytes));
  for (bool write : {true, false}) {
    const std::string dir = write ? "write" : "read";
    benchmark::RegisterBenchmark(("BM_RawDirect/" + dir).c_str(), BM_RawDirect, write)
        ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(2);
    // The aio defaults, then larger pieces and a deeper queue (aio.block_size 4 MiB, aio.queue_depth 32).
    for (const auto& [block, depth] : {std::pair<int64_t, int>{int64_t(1) << 20, 8}, {int64_t(4) << 20, 32}})
      benchmark::RegisterBenchmark(("BM_NvmeSwap/" + dir + "/block_KiB:" + std::to_string(block >> 10) +
                                    "/queue_depth:" + std::to_string(depth)).c_str(),
                                   BM_NvmeSwap, write, block, depth)
          ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(2);
  }
  int rank = 0;
#ifdef ZP_WITH_CUDA
  // The engine benchmark's ranks (mpirun -np 1|2); rank 0 reports.
  char** argv_left = args.data();
  zp::comm::Runtime rt(&nargs, &argv_left);
  g_rt = &rt;
  if (rt.device().is_cuda()) benchmark::AddCustomContext("device", zp::cuda_device_name(rt.device().index));
  benchmark::AddCustomContext("ranks", std::to_string(rt.world_size()));
  rank = rt.rank();
  keep_output_file_on_rank0(rank, &nargs, argv_left);
  benchmark::Initialize(&nargs, argv_left);
#else
  benchmark::Initialize(&nargs, args.data());
#endif
  run_benchmarks_on_every_rank(rank);
  return 0;
}
