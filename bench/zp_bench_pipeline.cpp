// Pipeline parallelism (issue 12) through the training driver itself: every rank runs `zeropipe
// train`'s loop on random tokens, with P stages x (world / P) data-parallel ranks, and rank 0 reads
// the per-step metrics back: tokens/s, step time, per-rank peak memory, the mean measured bubble over
// the stages beside the schedule's theoretical one, and the bytes one step moves between ranks
// (pipeline activations and their gradients; for ZeRO, its all-gathers and reduce-scatters), counted
// from the shapes. P = 1 is plain ZeRO data parallelism over the world, the comparison.
//   BM_Pipeline/<model>/<P>/<M>/<V>/<zero stage>/<keep>/<zb>   model 0 = a tiny GPT (10 layers, d=64: the
//   CPU and the five-rank consumer shape), 1 = the 1.42B GPT of zp_bench_zero (bf16, B=8, T=1024 per
//   micro-batch; GPUs). V > 1 runs the interleaved schedule, zb 1 the zero-bubble ZB-H1 one (V = 1);
//   keep 1 sets pipeline.keep_gathered. Steps 1-2 are warm-up; steps 3-8 are measured. The 1.42B GPT
//   is cut by pipeline.partition "compute": cut by parameters, the first stage's embedding (two layers'
//   worth of parameters, no FLOPs) left the last stage two layers' worth of head GEMMs more, and the
//   first stage idled ~11% of every step at M = 8 and 16 alike (measured on two H200s).
// On a CPU with fewer cores than ranks (mpirun --oversubscribe) the ranks share cores: a stage that
// waits gives its core to another (OMPI_MCA_mpi_yield_when_idle=1), so the measured bubble (idle time
// of each stage, 1 - busy / the step window) mixes the schedule's idle time with time-slicing; compare the
// schedules with each other there, and with theory on a core per rank.
// Run: mpirun -np 5 zp_bench_pipeline --benchmark_filter='BM_Pipeline/model:0/P:5/'   (CPU, P5)
//      mpirun -np 2 zp_bench_pipeline --benchmark_filter='BM_Pipeline/model:1/'     (2 GPUs)
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include "comm/bootstrap.h"
#include "core/allocator.h"
#include "io/config.h"
#include "io/token_dataset.h"
#include "runtime/lm_training.h"
#include "runtime/run_report.h"
#include "runtime/train_config.h"
#include "quiet_reporter.h"

namespace zp::bench {
namespace fs = std::filesystem;

comm::Runtime* g_rt = nullptr;
constexpr int kSteps = 8, kWarmup = 2;

void BM_Pipeline(benchmark::State& st) {
  const bool big = st.range(0) != 0;
  const int P = int(st.range(1)), M = int(st.range(2)), V = int(st.range(3)), zero = int(st.range(4));
  const bool keep = st.range(5) != 0, zb = st.range(6) != 0;
  comm::Runtime& rt = *g_rt;
  const int world = rt.world_size(), D = world / P;
  if (world % P != 0 || (big && !rt.device().is_cuda())) {
    st.SkipWithError(big ? "the 1.42B GPT needs GPUs" : "P does not divide the world size");
    for (auto _ : st) {}
    return;
  }
  const int64_t B = big ? 8 : 4, T = big ? 1024 : 64, vocab = big ? 50304 : 256, C = big ? 2048 : 64;
  const int layers = big ? 24 : 10;
  const io::json model = {{"model_type", "gpt2"}, {"vocab_size", vocab}, {"n_positions", T}, {"n_embd", C},
                          {"n_layer", layers}, {"n_head", big ? 16 : 4}};
  // Random tokens, enough for every step; one file written by rank 0.
  char dir[256] = {0};
  if (rt.rank() == 0)
    std::snprintf(dir, sizeof dir, "%s", (fs::temp_directory_path() / ("zp_bench_pipeline_" +
                                                                       std::to_string(::getpid()))).c_str());
  MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
  const std::string tokens = std::string(dir) + "/tokens.bin", metrics = std::string(dir) + "/metrics.jsonl";
  if (rt.rank() == 0) {
    fs::create_directories(dir);
    std::mt19937_64 g(3);
    std::vector<int32_t> t(size_t(B * T * M * D * kSteps + 1));
    for (auto& x : t) x = int32_t(g() % uint64_t(vocab - 47));
    io::write_token_file(tokens, t, int32_t(vocab));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const io::json user = {
      {"train_micro_batch_size_per_gpu", B},
      {"gradient_accumulation_steps", M},
      {"steps_per_print", 1000},
      {"bf16", {{"enabled", big}}},
      {"zero_optimization", {{"stage", zero}}},
      {"pipeline",
       {{"stages", P}, {"schedule", zb ? "zb-h1" : V > 1 ? "interleaved" : "1f1b"}, {"virtual_stages", V}, {"keep_gathered", keep},
        {"partition", big ? "compute" : "parameters"}}},
      {"model", {{"config", model}}},
      {"data", {{"train_files", {tokens}}, {"seq_len", T}}},
      {"training", {{"max_steps", kSteps}, {"metrics_file", metrics}, {"device", big ? "cuda" : "cpu"}}}};
  const runtime::TrainConfig cfg = runtime::TrainConfig::from(io::Config(runtime::train_config_schema(), user, "bench"));
  for (auto _ : st) {
    // Each row's own peak: the metrics report the allocator's peak, which lasts as long as the process.
    if (rt.device().is_cuda()) device_allocator(rt.device().index).reset_peak();
    runtime::train(cfg, rt, MPI_COMM_NULL, false);
    double ms = 0, bubble = 0, theory = 0, mem = 0, busy = 0, window = 0, recv_gaps = 0, other_gaps = 0;
    if (rt.rank() == 0) {
      int n = 0;
      for (const runtime::StepRecord& r : runtime::read_metrics_file(metrics).steps) {
        if (!std::isnan(r.peak_mem_gib)) mem = std::max(mem, r.peak_mem_gib);
        if (r.step <= kWarmup) continue;
        ++n;
        ms += r.step_ms;
        if (!std::isnan(r.mean_bubble)) {
          bubble += r.mean_bubble;
          theory = r.theoretical_bubble;
          busy += r.stage_busy_ms;
          window += r.window_ms;
          recv_gaps += r.recv_gap_ms;
          other_gaps += r.other_gap_ms;
        }
      }
      ms /= n;
      bubble /= n;
      for (double* x : {&busy, &window, &recv_gaps, &other_gaps}) *x /= n;
    }
    st.SetIterationTime(ms / 1e3);
    const double tokens_per_step = double(B * T * M * D);
    st.counters["tokens_per_s"] = tokens_per_step / (ms / 1e3);
    st.counters["step_ms"] = ms;
    st.counters["peak_mem_gib_rank0"] = mem;
    st.counters["bubble_measured"] = bubble;
    st.counters["bubble_theory"] = theory;
    if (P > 1) {  // rank 0's stage (the first): where its idle time sits (ZP_PIPELINE_TRACE logs every stage's)
      st.counters["stage0_busy_ms"] = busy;
      st.counters["window_ms"] = window;
      st.counters["stage0_recv_gap_ms"] = recv_gaps;
      st.counters["stage0_other_gap_ms"] = other_gaps;
    }
    // Bytes per step over all links: each inner chunk boundary carries M activations forward and M
    // gradients back (compute dtype), in each of the D pipelines.
    const double act = double(B * T * C) * (big ? 2 : 4);
    st.counters["pipeline_bytes_per_step"] = P > 1 ? 2.0 * M * act * (P * V - 1) * D : 0.0;
    // ZeRO's collectives per step over the data group of each stage (ring: (D-1)/D of the buffer
    // per rank): stage 3 gathers the bf16 weights twice (forward and backward) per micro-batch, and
    // every stage reduces the fp32 gradients once.
    const double params = 12.0 * C * C * layers + double(vocab + T) * C;
    const double ring = D > 1 ? double(D - 1) / D : 0.0;
    // (once per step when it keeps them gathered)
    const double gathers = keep ? 1.0 : 2.0 * M;
    const double gather = zero == 3 ? gathers * params * (big ? 2 : 4) : (zero >= 1 ? params * (big ? 2 : 4) : 0.0);
    st.counters["zero_bytes_per_step"] = ring * (gather + params * 4) * world;
  }
  if (rt.rank() == 0) fs::remove_all(dir);
}
BENCHMARK(BM_Pipeline)
    ->ArgNames({"model", "P", "M", "V", "zero", "keep", "zb"})
    // CPU: the five-rank consumer shape, 1F1B, interleaved and ZB-H1 bubbles against theory.
    ->Args({0, 5, 5, 1, 1, 0, 0})
    ->Args({0, 5, 5, 1, 1, 0, 1})
    ->Args({0, 5, 10, 1, 1, 0, 0})
    ->Args({0, 5, 10, 2, 1, 0, 0})
    ->Args({0, 5, 10, 1, 1, 0, 1})
    ->Args({0, 2, 4, 1, 1, 0, 0})
    ->Args({0, 2, 4, 1, 1, 0, 1})
    // P2 at M = 8: a core per rank on a two-core machine, the three schedules against theory.
    ->Args({0, 2, 8, 1, 1, 0, 0})
    ->Args({0, 2, 8, 2, 1, 0, 0})
    ->Args({0, 2, 8, 1, 1, 0, 1})
    ->Args({0, 1, 4, 1, 3, 0, 0})
    // 2 GPUs: P2 against ZeRO-3 D2 at M = 4, 8, 16; ZB-H1 below 1F1B's bubble.
    ->Args({1, 2, 4, 1, 1, 0, 0})
    ->Args({1, 2, 8, 1, 1, 0, 0})
    ->Args({1, 2, 8, 1, 1, 0, 1})
    ->Args({1, 2, 16, 1, 1, 0, 0})
    ->Args({1, 1, 4, 1, 3, 0, 0})
    ->Args({1, 1, 8, 1, 3, 0, 0})
    ->Args({1, 1, 16, 1, 3, 0, 0})
    // ZeRO-3 keeping each block gathered for the step's micro-batches (pipeline.keep_gathered).
    ->Args({1, 1, 8, 1, 3, 1, 0})
    ->Args({1, 2, 8, 1, 3, 0, 0})
    ->Args({1, 2, 8, 1, 3, 1, 0})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace zp::bench

int main(int argc, char** argv) {
  zp::comm::Runtime rt(&argc, &argv);
  zp::bench::g_rt = &rt;
  benchmark::AddCustomContext("ranks", std::to_string(rt.world_size()));
  zp::bench::keep_output_file_on_rank0(rt.rank(), &argc, argv);
  benchmark::Initialize(&argc, argv);
  zp::bench::run_benchmarks_on_every_rank(rt.rank());
  return 0;
}
