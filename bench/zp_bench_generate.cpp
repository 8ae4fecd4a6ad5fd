// Generation through the paged KV cache and continuous batching (issue 13): Llama-shaped 1B
// (Llama 3.2 1B) and 8B (Llama 3.1 8B) with random bf16 weights on one GPU.
//   BM_Generate: `batch` prompts of 128 random tokens, 128 new tokens each (no stop token), all
//     submitted at once; tokens/s = generated tokens over the whole run (prefill included, as a
//     transformers `generate` call is timed), and decode_tokens_per_s over the decode-only steps.
//     At batch 1 the decode rate is set beside the memory-bandwidth roofline: every step reads the
//     weights and the sequence's KV cache once, so tokens/s <= bandwidth / (weight bytes + KV bytes),
//     with the bandwidth measured here (a device-to-device copy, read + write). The KV cache takes
//     what the GPU has free (as `generate` does) or, with kv_GiB > 0, that many GiB.
//   BM_Prefill: 32 prompts of 1024 tokens, one new token each: prompt tokens/s.
//   BM_StreamedDecode: a model larger than the GPU (a Llama 3 70B shape cut to `layers` layers: 48
//     layers are 86 GB of bf16 weights) kept in pinned host memory and streamed up layer by layer
//     (--offload-param cpu's path), decoding 256 sequences: the weights' host-to-device bandwidth
//     beside the PCIe bandwidth measured here (one pinned copy), the target being 85%.
// The anchor, transformers' generate on the same GPU (eager and static cache + torch.compile), is
// bench/reference/torch_generate.py.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <chrono>
#include <random>

#include "bench_common.h"
#include "models/transformer.h"
#include "parallel/collective_stream.h"
#include "parallel/parameter_gatherer.h"
#include "parallel/zero_engine.h"
#include "runtime/generation_engine.h"

namespace zp::bench {

namespace {

nlohmann::json llama_shape(int which) {
  if (which == 0)  // Llama 3.2 1B
    return {{"model_type", "llama"}, {"vocab_size", 128256}, {"hidden_size", 2048}, {"intermediate_size", 8192},
            {"num_hidden_layers", 16}, {"num_attention_heads", 32}, {"num_key_value_heads", 8},
            {"max_position_embeddings", 8192}, {"rope_theta", 500000.0}, {"rms_norm_eps", 1e-5},
            {"tie_word_embeddings", true}};
  return {{"model_type", "llama"}, {"vocab_size", 128256}, {"hidden_size", 4096}, {"intermediate_size", 14336},
          {"num_hidden_layers", 32}, {"num_attention_heads", 32}, {"num_key_value_heads", 8},
          {"max_position_embeddings", 8192}, {"rope_theta", 500000.0}, {"rms_norm_eps", 1e-5}};
}

// GB/s of repeated copies of `bytes` from a `from` buffer to a `to` one (cudaMemcpyKind): the device's
// memory bandwidth from a device-to-device copy (which reads and writes every byte, so twice the
// bytes count), the PCIe bandwidth from a pinned host-to-device one.
double measured_copy_gbs(cudaMemcpyKind kind) {
  const size_t bytes = size_t(1) << 30;
  const bool h2d = kind == cudaMemcpyHostToDevice;
  void *src = nullptr, *dst = nullptr;
  if (h2d) cudaMallocHost(&src, bytes); else cudaMalloc(&src, bytes);
  cudaMalloc(&dst, bytes);
  cudaMemcpy(dst, src, bytes, kind);
  Event e0, e1;
  e0.record(nullptr);
  for (int i = 0; i < 10; ++i) cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
  e1.record(nullptr);
  e1.synchronize();
  const double s = e1.elapsed_ms_since(e0) / 1e3;
  if (h2d) cudaFreeHost(src); else cudaFree(src);
  cudaFree(dst);
  return (h2d ? 1.0 : 2.0) * 10.0 * double(bytes) / s / 1e9;
}

double measured_bandwidth_gbs() {
  static const double gbs = measured_copy_gbs(cudaMemcpyDeviceToDevice);
  return gbs;
}

struct Setup {
  models::TransformerConfig cfg;
  Stream stream{Device::cuda(0)};
  std::unique_ptr<models::Transformer> model;
  int64_t weight_bytes = 0;
  explicit Setup(int which) : cfg(models::TransformerConfig::from_hub_json(llama_shape(which), "llama")) {
    model = std::make_unique<models::Transformer>(cfg, Device::cuda(0), DType::BF16, stream.handle());
    fill_blocks_random(model->blocks(), Device::cuda(0), stream.handle());
    for (nn::ParamBlock* b : model->blocks()) weight_bytes += b->padded() * int64_t(dtype_size(b->dtype()));
    stream.synchronize();
  }
};

std::vector<int32_t> random_prompt(std::mt19937& g, int64_t n, int64_t vocab) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = int32_t(g() % uint32_t(vocab));
  return p;
}

}  // namespace

void BM_Generate(benchmark::State& st) {
  const int which = int(st.range(0));
  const int64_t batch = st.range(1), prompt = 128, new_tokens = 128;
  MemoryPeaks peaks;
  Setup m(which);
  runtime::GenerationOptions o;
  o.kv_cache_bytes = st.range(2) << 30;  // 0: what the GPU has free
  o.max_seqs = batch;
  o.max_batch_tokens = std::max<int64_t>(8192, batch * prompt);
  runtime::GenerationEngine engine(*m.model, nullptr, o);
  std::mt19937 g(7);
  double decode_ms = 0, device_ms = 0, total_s = 0;
  int64_t decode_tokens = 0, iters = 0;
  for (auto _ : st) {
    const runtime::GenerationStats before = engine.stats();
    for (int64_t i = 0; i < batch; ++i) {
      runtime::GenerationRequest r;
      r.prompt = random_prompt(g, prompt, m.cfg.vocab);
      r.max_new_tokens = new_tokens;
      engine.submit(std::move(r));
    }
    const auto t0 = std::chrono::steady_clock::now();
    engine.run();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    st.SetIterationTime(s);
    peaks.sample();
    if (iters++ == 0) continue;  // the first run warms up (cuBLAS plans, the allocator's pool)
    total_s += s;
    decode_ms += engine.stats().decode_step_ms - before.decode_step_ms;
    device_ms += engine.stats().decode_device_ms - before.decode_device_ms;
    decode_tokens += engine.stats().decode_tokens - before.decode_tokens;
  }
  const double runs = double(iters - 1);
  st.counters["tokens_per_s"] = double(batch * new_tokens) * runs / total_s;
  st.counters["decode_tokens_per_s"] = double(decode_tokens) / (decode_ms / 1e3);
  st.counters["ms_per_decode_step"] = decode_ms / (double(decode_tokens) / double(batch));
  // The GPU's share of a decode step (events from its upload to its tokens); the rest is the host's.
  st.counters["device_ms_per_decode_step"] = device_ms / (double(decode_tokens) / double(batch));
  if (batch == 1) {
    // Mean KV bytes read per decode step: the context grows from prompt to prompt + new_tokens.
    const double kv = double(m.cfg.layers * 2 * m.cfg.kv_heads * m.cfg.head_dim * 2) * double(prompt + new_tokens / 2);
    const double roofline = measured_bandwidth_gbs() * 1e9 / (double(m.weight_bytes) + kv);
    st.counters["roofline_tokens_per_s"] = roofline;
    st.counters["pct_of_roofline"] = 100.0 * st.counters["decode_tokens_per_s"] / roofline;
    st.counters["bandwidth_GBs"] = measured_bandwidth_gbs();
  }
  st.counters["weights_GiB"] = double(m.weight_bytes) / double(1ull << 30);
  st.counters["kv_cache_GiB"] = double(engine.cache_bytes()) / double(1ull << 30);
  st.counters["peak_device_GiB"] = peaks.device_gib();
}
BENCHMARK(BM_Generate)->ArgNames({"model_8b", "batch", "kv_GiB"})
    ->Args({0, 1, 0})->Args({0, 1, 4})->Args({0, 64, 0})->Args({0, 256, 0})->Args({1, 1, 0})->Args({1, 64, 0})
    ->Args({1, 256, 0})
    ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);

void BM_Prefill(benchmark::State& st) {
  const int which = int(st.range(0));
  const int64_t prompts = 32, prompt = 1024;
  Setup m(which);
  runtime::GenerationOptions o;
  o.max_seqs = prompts;
  o.max_batch_tokens = 16384;
  runtime::GenerationEngine engine(*m.model, nullptr, o);
  std::mt19937 g(7);
  double total = 0;
  int64_t iters = 0;
  for (auto _ : st) {
    for (int64_t i = 0; i < prompts; ++i) {
      runtime::GenerationRequest r;
      r.prompt = random_prompt(g, prompt, m.cfg.vocab);
      r.max_new_tokens = 1;
      engine.submit(std::move(r));
    }
    const auto t0 = std::chrono::steady_clock::now();
    engine.run();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    st.SetIterationTime(s);
    if (iters++ > 0) total += s;
  }
  st.counters["prefill_tokens_per_s"] = double(prompts * prompt) * double(iters - 1) / total;
}
BENCHMARK(BM_Prefill)->ArgNames({"model_8b"})->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);

void BM_StreamedDecode(benchmark::State& st) {
  const int64_t layers = st.range(0), batch = 256, prompt = 128, new_tokens = 8;
  const nlohmann::json hub = {{"model_type", "llama"}, {"vocab_size", 128256}, {"hidden_size", 8192},
                              {"intermediate_size", 28672}, {"num_hidden_layers", layers},
                              {"num_attention_heads", 64}, {"num_key_value_heads", 8},
                              {"max_position_embeddings", 8192}, {"rope_theta", 500000.0}, {"rms_norm_eps", 1e-5}};
  const auto cfg = models::TransformerConfig::from_hub_json(hub, "llama-70b-cut");
  const double pcie = measured_copy_gbs(cudaMemcpyHostToDevice);
  Stream stream(Device::cuda(0));
  const StreamHandle s = stream.handle();
  MemoryPeaks peaks;
  models::Transformer model(cfg, Device::cuda(0), DType::BF16, s, parallel::shard_pad_multiple(1), /*allocate=*/false);
  parallel::CollectiveStream collective(nullptr, s);
  parallel::ParameterGatherer gatherer(nullptr, collective, parallel::StateTier::PinnedHost);
  int64_t weight_bytes = 0;
  for (nn::ParamBlock* b : model.blocks()) {
    b->bind_values(Tensor::empty({b->padded()}, b->dtype(), b->device(), "params", s));
    fill_blocks_random({b}, Device::cuda(0), s);
    gatherer.add(*b);
    weight_bytes += b->padded() * int64_t(dtype_size(b->dtype()));
  }
  model.set_block_access(&gatherer);
  stream.synchronize();
  runtime::GenerationOptions o;
  o.max_seqs = batch;
  o.max_batch_tokens = batch * prompt;
  runtime::GenerationEngine engine(model, nullptr, o);
  engine.set_before_forward([&] { gatherer.begin_step(); });
  std::mt19937 g(7);
  double decode_ms = 0;
  int64_t decode_steps = 0, iters = 0;
  for (auto _ : st) {
    const runtime::GenerationStats before = engine.stats();
    for (int64_t i = 0; i < batch; ++i) {
      runtime::GenerationRequest r;
      r.prompt = random_prompt(g, prompt, cfg.vocab);
      r.max_new_tokens = new_tokens;
      engine.submit(std::move(r));
    }
    const auto t0 = std::chrono::steady_clock::now();
    engine.run();
    st.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    peaks.sample();
    ++iters;
    decode_ms += engine.stats().decode_step_ms - before.decode_step_ms;
    decode_steps += (engine.stats().steps - before.steps) - 1;  // the first step is the prefill
  }
  model.set_block_access(nullptr);
  const double step_s = decode_ms / 1e3 / double(decode_steps);
  st.counters["weights_GB"] = double(weight_bytes) / 1e9;
  st.counters["decode_step_s"] = step_s;
  st.counters["decode_tokens_per_s"] = double(batch) / step_s;
  st.counters["stream_GBs"] = double(weight_bytes) / step_s / 1e9;
  st.counters["pcie_h2d_GBs"] = pcie;
  st.counters["pct_of_pcie"] = 100.0 * double(weight_bytes) / step_s / 1e9 / pcie;
  st.counters["peak_device_GiB"] = peaks.device_gib();
}
BENCHMARK(BM_StreamedDecode)->ArgNames({"layers"})->Arg(48)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace zp::bench

int main(int argc, char** argv) { return zp::bench::run_gpu_benchmarks(argc, argv, "zp_bench_generate"); }
