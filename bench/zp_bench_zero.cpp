// ZeRO stages 0-3 on the 1.42B GPT of the FSDP2 comparison (d=2048, 24 layers, vocab 50304,
// B=8, T=1024 per GPU, bf16 compute, fp32 master weights and gradients): tokens/s over all ranks,
// per-rank peak device memory (the engine's allocator peak) and the time collectives take per step
// (with overlap: time the communication stream is busy, mostly hidden behind the backward). Args:
// stage, overlap (collectives on a communication stream, the default; 0 = on the compute stream)
// and in_backward (stages 2/3: AdamW runs on each block as its gradients are reduced, no clipping).
// Run with `mpirun -np 1` and `-np 2`; rank 0 prints Google Benchmark output.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "comm/bootstrap.h"
#include "comm/topology.h"
#include "core/device.h"
#include "core/tensor.h"
#include "kernels/elementwise.h"
#include "models/transformer.h"
#include "parallel/zero_engine.h"
#include "runtime/causal_lm_loss.h"
#include "bench_common.h"
#include "quiet_reporter.h"

namespace zp::bench {

comm::Runtime* g_rt = nullptr;

void BM_ZeroStep(benchmark::State& st) {
  const int stage = int(st.range(0));
  const bool overlap = st.range(1) != 0, in_backward = st.range(2) != 0;
  const int64_t B = 8, T = 1024;
  comm::Runtime& rt = *g_rt;
  const int world = rt.world_size();
  std::unique_ptr<comm::Communicator> dp;
  if (world > 1) dp = comm::make_communicator(comm::Backend::Nccl, rt.world());
  nlohmann::json hub = {{"model_type", "gpt2"}, {"vocab_size", 50304}, {"n_positions", 1024}, {"n_embd", 2048},
                        {"n_layer", 24}, {"n_head", 16}};
  auto cfg = models::TransformerConfig::from_hub_json(hub, "gpt-1.42b");
  Stream stream(rt.device());
  const StreamHandle s = stream.handle();
  cudaDeviceSynchronize();
  device_allocator(rt.device().index).reset_peak();
  size_t peak_before = device_allocator(rt.device().index).stats().current;
  double tok_s = 0, comm = 0, mfu = 0, peak = 0;
  {
    models::Transformer model(cfg, rt.device(), DType::BF16, s, parallel::shard_pad_multiple(world));
    fill_blocks_random(model.blocks(), rt.device(), s);
    parallel::AdamWHyper hyper{3e-4, 0.9, 0.95, 1e-8, 0.1, false};
    hyper.step_in_backward = in_backward;
    parallel::ZeroEngine engine(model.blocks(), parallel::ShardingPolicy::zero_stage(stage), dp.get(), hyper, s);
    model.set_block_access(&engine);
    engine.set_overlap_comm(overlap);
    engine.set_timing(true);
    std::mt19937 g(uint32_t(rt.rank() + 1));
    Tensor ids_h = Tensor::empty({B * T}, DType::I32, Device::cpu());
    for (int64_t i = 0; i < B * T; ++i) ids_h.data<int32_t>()[i] = int32_t(g() % 50257);
    Tensor ids = ids_h.to(rt.device(), s);
    auto step = [&] {
      engine.begin_step();
      engine.begin_micro_step(true);
      if (in_backward) engine.set_update_in_backward(1.f);
      models::TransformerActivations acts;
      model.forward(ids.data<int32_t>(), B, T, acts);
      runtime::CausalLmLoss loss(acts.logits, cfg.vocab, ids.data<int32_t>(), B * T, s);
      model.backward(acts, loss.backward(acts.logits));
      engine.finish_gradients();
      const double norm = std::sqrt(engine.grad_norm_squared());
      if (!in_backward) engine.step(float(norm > 1.0 ? 1.0 / norm : 1.0));
    };
    const double secs = timed_iterations(st, s, step, [&] { engine.comm_ms(); });  // comm from here on
    tok_s = double(world * B * T) / secs;
    comm = engine.comm_ms() / double(st.iterations());
    mfu = 100.0 * model.flops_per_token(T) * tok_s / world / (cuda_peak_bf16_tflops(rt.device().index) * 1e12);
  }
  peak = double(device_allocator(rt.device().index).stats().peak - peak_before) / double(1ull << 30);
  st.counters["world"] = world;
  st.counters["tokens_per_s"] = tok_s;
  st.counters["tokens_per_s_per_gpu"] = tok_s / world;
  st.counters["comm_ms_per_step"] = comm;
  st.counters["MFU_pct"] = mfu;
  st.counters["peak_engine_GiB_rank0"] = peak;
}
BENCHMARK(BM_ZeroStep)->ArgNames({"stage", "overlap", "in_backward"})
    ->ArgsProduct({{0, 1, 2, 3}, {1, 0}, {0}})->Args({2, 1, 1})->Args({3, 1, 1})
    ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);


}  // namespace zp::bench

int main(int argc, char** argv) {
  zp::comm::Runtime rt(&argc, &argv);
  zp::bench::g_rt = &rt;
  if (!rt.device().is_cuda()) {
    std::fprintf(stderr, "zp_bench_zero: %s\n", zp::cuda_unavailable_reason().c_str());
    return 1;
  }
  benchmark::AddCustomContext("device", zp::cuda_device_name(rt.device().index));
  benchmark::AddCustomContext("ranks", std::to_string(rt.world_size()));
  zp::bench::keep_output_file_on_rank0(rt.rank(), &argc, argv);
  benchmark::Initialize(&argc, argv);
  zp::bench::run_benchmarks_on_every_rank(rt.rank());
  return 0;
}
