// One full training step of GPT-2 124M (B=32, T=1024, bf16 compute, fp32 master weights and AdamW,
// from random init on random tokens): forward, backward, global-norm clipping and the optimizer
// update, timed with CUDA events. Reports tokens/s, MFU against the device's dense bf16 peak and
// peak device memory (the engine's allocator peak, and everything the process holds on the device
// including library workspaces). --benchmark_format=json for CI tracking.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "core/device.h"
#include "core/tensor.h"
#include "kernels/reduce.h"
#include "models/transformer.h"
#include "parallel/zero_engine.h"
#include "runtime/causal_lm_loss.h"
#include "bench_common.h"

namespace zp::bench {

void BM_TrainStepGpt2(benchmark::State& st) {
  const int64_t B = st.range(0), T = st.range(1);
  const bool checkpoint = st.range(2);
  nlohmann::json hub = {{"model_type", "gpt2"}, {"vocab_size", 50257}, {"n_positions", 1024}, {"n_embd", 768},
                        {"n_layer", 12}, {"n_head", 12}};
  auto cfg = models::TransformerConfig::from_hub_json(hub, "gpt2-124m");
  Stream stream(Device::cuda(0));
  const StreamHandle s = stream.handle();
  MemoryPeaks peaks;
  models::Transformer model(cfg, Device::cuda(0), DType::BF16, s);
  model.init_random(1234, 0.02);
  parallel::ZeroEngine engine(model.blocks(), parallel::ShardingPolicy::zero_stage(0), nullptr, {6e-4, 0.9, 0.95, 1e-8, 0.1, false}, s);

  std::mt19937 g(1);
  Tensor ids_h = Tensor::empty({B * T}, DType::I32, Device::cpu()), tgt_h = Tensor::empty({B * T}, DType::I32, Device::cpu());
  for (int64_t i = 0; i < B * T; ++i) {
    ids_h.data<int32_t>()[i] = int32_t(g() % 50257);
    tgt_h.data<int32_t>()[i] = int32_t(g() % 50257);
  }
  Tensor ids = ids_h.to(Device::cuda(0), s), tgt = tgt_h.to(Device::cuda(0), s);
  auto step = [&] {
    engine.begin_step();
    models::TransformerActivations acts;
    model.forward(ids.data<int32_t>(), B, T, acts,
                  checkpoint ? models::ForwardMode::TrainCheckpointed : models::ForwardMode::Train);
    runtime::CausalLmLoss loss(acts.logits, cfg.vocab, tgt.data<int32_t>(), B * T, s);
    model.backward(acts, loss.backward(acts.logits));
    const double norm = std::sqrt(engine.grad_norm_squared());
    engine.step(float(norm > 1.0 ? 1.0 / norm : 1.0));
    peaks.sample();
  };
  const double secs = timed_iterations(st, s, step);
  const double tok_s = double(B * T) / secs;
  st.counters["tokens_per_s"] = tok_s;
  st.counters["MFU_pct"] = 100.0 * model.flops_per_token(T) * tok_s / (cuda_peak_bf16_tflops(0) * 1e12);
  st.counters["peak_engine_GiB"] = peaks.engine_gib();
  st.counters["peak_device_GiB"] = peaks.device_gib();
}
BENCHMARK(BM_TrainStepGpt2)->ArgNames({"B", "T", "ckpt"})->Args({32, 1024, 0})->Args({32, 1024, 1})
    ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);

}  // namespace zp::bench

int main(int argc, char** argv) { return zp::bench::run_gpu_benchmarks(argc, argv, "zp_bench_train"); }
