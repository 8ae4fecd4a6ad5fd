// LoRA fine-tuning step of a Llama 3 8B-shaped model (issue 14): r = 16, alpha 32, dropout 0.05, on
// all seven linear modules of every layer, bf16 compute, B = 1, T = 2048, the base frozen (no
// gradients, no optimizer state) and the adapters trained with AdamW (fp32 master and moments).
// Variants: activation checkpointing on or off, and the base's shards in pinned host memory (ZeRO-3's
// parameter tier on one GPU: every layer is copied up for its forward and backward, prefetched on
// the upload stream). Reports tokens/s, MFU of the step's useful FLOPs (forward 2 per base parameter
// and token, backward 2 for the input gradients; no weight gradients for the base) and the peak
// device memory. The anchor, PEFT on transformers with the same shapes, is bench/reference/torch_lora.py.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cmath>
#include <random>

#include "bench_common.h"
#include "core/device.h"
#include "kernels/elementwise.h"
#include "models/transformer.h"
#include "parallel/zero_engine.h"
#include "runtime/causal_lm_loss.h"

namespace zp::bench {

void BM_LoraLlama8B(benchmark::State& st) {
  const int64_t B = 1, T = st.range(0);
  const bool checkpoint = st.range(1), offload_base = st.range(2);
  const nlohmann::json hub = {{"model_type", "llama"},          {"vocab_size", 128256},
                              {"hidden_size", 4096},            {"intermediate_size", 14336},
                              {"num_hidden_layers", 32},        {"num_attention_heads", 32},
                              {"num_key_value_heads", 8},       {"max_position_embeddings", 8192},
                              {"rope_theta", 500000.0},         {"rms_norm_eps", 1e-5}};
  const auto cfg = models::TransformerConfig::from_hub_json(hub, "llama-3-8b");
  models::LoraSpec lora{16, 32, 0.05, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, false};
  Stream stream(Device::cuda(0));
  const StreamHandle s = stream.handle();
  MemoryPeaks peaks;
  models::Transformer model(cfg, Device::cuda(0), DType::BF16, s, parallel::shard_pad_multiple(1), false, {}, lora);
  const parallel::ShardingPolicy policy =
      offload_base ? parallel::ShardingPolicy::from_config(3, "none", "cpu") : parallel::ShardingPolicy::zero_stage(0);
  parallel::ZeroEngine engine(model.blocks(), policy, nullptr, {1e-4, 0.9, 0.999, 1e-8, 0.0, false}, s,
                              [&](nn::ParamBlock& b) { fill_blocks_random({&b}, Device::cuda(0), s); });
  model.set_block_access(&engine);

  std::mt19937 g(1);
  Tensor ids_h = Tensor::empty({B * T}, DType::I32, Device::cpu()), tgt_h = Tensor::empty({B * T}, DType::I32, Device::cpu());
  for (int64_t i = 0; i < B * T; ++i) {
    ids_h.data<int32_t>()[i] = int32_t(g() % 128256);
    tgt_h.data<int32_t>()[i] = int32_t(g() % 128256);
  }
  Tensor ids = ids_h.to(Device::cuda(0), s), tgt = tgt_h.to(Device::cuda(0), s);
  int64_t step_no = 0;
  auto step = [&] {
    engine.begin_step();
    models::TransformerActivations acts;
    model.forward(ids.data<int32_t>(), B, T, acts,
                  checkpoint ? models::ForwardMode::TrainCheckpointed : models::ForwardMode::Train,
                  {uint64_t(0x9E37 + ++step_no), 0});
    runtime::CausalLmLoss loss(acts.logits, cfg.vocab, tgt.data<int32_t>(), B * T, s);
    model.backward(acts, loss.backward(acts.logits));
    engine.finish_gradients();
    const double norm = std::sqrt(engine.grad_norm_squared());
    engine.step(float(norm > 1.0 ? 1.0 / norm : 1.0));
    peaks.sample();
  };
  const double secs = timed_iterations(st, s, step);
  const double tok_s = double(B * T) / secs;
  // Useful FLOPs: a frozen base has no weight-gradient GEMMs, the adapters do (the model counts both).
  const double flops_per_token = model.flops_per_token(T);
  int64_t trained = 0;
  for (nn::ParamBlock* b : model.trainable_blocks())
    for (const auto& p : b->params()) trained += p->numel();
  st.counters["tokens_per_s"] = tok_s;
  st.counters["MFU_pct"] = 100.0 * flops_per_token * tok_s / (cuda_peak_bf16_tflops(0) * 1e12);
  st.counters["peak_engine_GiB"] = peaks.engine_gib();
  st.counters["peak_device_GiB"] = peaks.device_gib();
  st.counters["trainable_M"] = double(trained) / 1e6;
}
BENCHMARK(BM_LoraLlama8B)->ArgNames({"T", "ckpt", "offload_base"})
    ->Args({2048, 0, 0})->Args({2048, 1, 0})->Args({2048, 1, 1})
    ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(8);

}  // namespace zp::bench

int main(int argc, char** argv) { return zp::bench::run_gpu_benchmarks(argc, argv, "zp_bench_lora"); }
