// One full diffusion training step of the Stable Diffusion 1.5 UNet (860M parameters; B=8, 64x64
// latents, 77 text tokens of 768) and the SDXL base UNet (2.57B; B=2, 128x128 latents, 77 tokens of
// 2048, text_time conditioning): bf16 compute, fp32 master weights and AdamW, random weights (bench_weights.h) and random
// data; forward, weighted MSE against a noise target, backward, global-norm clipping and the optimizer
// update, timed with CUDA events. Reports samples/s, achieved TFLOP/s and MFU against the device's
// dense bf16 peak (FLOPs from models::unet_train_flops_per_sample), and peak device memory (the
// engine allocator's peak, and everything the process holds on the device including library
// workspaces). Each runs plain (ckpt:0) and with activation checkpointing (ckpt:1, models/unet.h:
// every ResBlock and transformer block re-runs its forward in the backward), so one run reports the
// memory saved and the time it costs; in_backward:1 runs the optimizer inside the backward
// (optimizer.step_in_backward: ZeRO stage 2 on one GPU, each block updated as soon as its gradients
// are complete, so no step-long fp32 gradient buffer; no clipping). --benchmark_format=json for CI
// tracking.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "core/allocator.h"
#include "core/device.h"
#include "core/tensor.h"
#include "kernels/elementwise.h"
#include "kernels/mse.h"
#include "models/unet.h"
#include "parallel/zero_engine.h"
#include "bench_common.h"
#include "models/unet_flops.h"

namespace zp::bench {
using nlohmann::json;

// runwayml/stable-diffusion-v1-5 unet/config.json.
const json& sd15_config() {
  static const json j = json::parse(R"({
    "_class_name": "UNet2DConditionModel",
    "_diffusers_version": "0.6.0",
    "act_fn": "silu",
    "attention_head_dim": 8,
    "block_out_channels": [320, 640, 1280, 1280],
    "center_input_sample": false,
    "cross_attention_dim": 768,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "downsample_padding": 1,
    "flip_sin_to_cos": true,
    "freq_shift": 0,
    "in_channels": 4,
    "layers_per_block": 2,
    "mid_block_scale_factor": 1,
    "norm_eps": 1e-05,
    "norm_num_groups": 32,
    "out_channels": 4,
    "sample_size": 64,
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"]
  })");
  return j;
}

// stabilityai/stable-diffusion-xl-base-1.0 unet/config.json (upcast_attention written as false).
const json& sdxl_config() {
  static const json j = json::parse(R"({
    "_class_name": "UNet2DConditionModel",
    "_diffusers_version": "0.19.0.dev0",
    "act_fn": "silu",
    "addition_embed_type": "text_time",
    "addition_embed_type_num_heads": 64,
    "addition_time_embed_dim": 256,
    "attention_head_dim": [5, 10, 20],
    "block_out_channels": [320, 640, 1280],
    "center_input_sample": false,
    "class_embed_type": null,
    "class_embeddings_concat": false,
    "conv_in_kernel": 3,
    "conv_out_kernel": 3,
    "cross_attention_dim": 2048,
    "cross_attention_norm": null,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    "downsample_padding": 1,
    "dual_cross_attention": false,
    "encoder_hid_dim": null,
    "encoder_hid_dim_type": null,
    "flip_sin_to_cos": true,
    "freq_shift": 0,
    "in_channels": 4,
    "layers_per_block": 2,
    "mid_block_only_cross_attention": null,
    "mid_block_scale_factor": 1,
    "mid_block_type": "UNetMidBlock2DCrossAttn",
    "norm_eps": 1e-05,
    "norm_num_groups": 32,
    "num_attention_heads": null,
    "num_class_embeds": null,
    "only_cross_attention": false,
    "out_channels": 4,
    "projection_class_embeddings_input_dim": 2816,
    "resnet_out_scale_factor": 1.0,
    "resnet_skip_time_act": false,
    "resnet_time_scale_shift": "default",
    "sample_size": 128,
    "time_cond_proj_dim": null,
    "time_embedding_act_fn": null,
    "time_embedding_dim": null,
    "time_embedding_type": "positional",
    "timestep_post_act": null,
    "transformer_layers_per_block": [1, 2, 10],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "upcast_attention": false,
    "use_linear_projection": true
  })");
  return j;
}

Tensor random_tensor(const Shape& shape, DType dt, uint64_t seed, StreamHandle s, float scale = 1.f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(size_t(shape_numel(shape)));
  for (float& x : v) x = d(g);
  Tensor h = Tensor::empty(shape, dt, Device::cpu(), "bench");
  kernels::cpu::cast(nullptr, dt, h.data(), DType::F32, v.data(), int64_t(v.size()));
  return h.to(Device::cuda(0), s);
}

// lora_r > 0: LoRA of that rank (alpha = r) on the attention projections (to_q, to_k, to_v, to_out.0
// of attn1 and attn2), the rest frozen (issue 14).
void train_step(benchmark::State& st, const json& hub, int64_t B, int64_t L, bool checkpoint, bool in_backward,
                int64_t lora_r = 0) {
  const auto cfg = models::UNetConfig::from_hub_json(hub, "bench");
  const int64_t S = hub["sample_size"].get<int64_t>(), C = cfg.in_channels, n = C * S * S;
  const int64_t D = cfg.cross_dim.back(), E = cfg.text_embeds_dim();
  Stream stream(Device::cuda(0));
  const StreamHandle s = stream.handle();
  MemoryPeaks peaks;
  double flops_sample = 0;
  int64_t params = 0;
  {
    const models::LoraSpec lora{lora_r, double(lora_r), 0.0, {"to_q", "to_k", "to_v", "to_out.0"}, false};
    models::UNet model(cfg, Device::cuda(0), DType::BF16, s, 1, true, lora);
    fill_blocks_random(model.blocks(), Device::cuda(0), s);
    parallel::AdamWHyper hyper{1e-4, 0.9, 0.999, 1e-8, 0.01, false};
    hyper.step_in_backward = in_backward;
    parallel::ZeroEngine engine(model.blocks(), parallel::ShardingPolicy::zero_stage(in_backward ? 2 : 0), nullptr,
                                hyper, s);
    model.set_block_access(&engine);
    flops_sample = models::unet_train_flops_per_sample(model, S, S, L);
    params = model.num_parameters();

    models::UNetInputs in;
    in.sample = random_tensor({B, C, S, S}, DType::BF16, 1, s);
    in.encoder_hidden_states = random_tensor({B, L, D}, DType::BF16, 2, s);
    std::mt19937 g(3);
    for (int64_t b = 0; b < B; ++b) in.timesteps.push_back(float(g() % 1000));
    if (E > 0) {
      in.text_embeds = random_tensor({B, E}, DType::BF16, 4, s);
      for (int64_t b = 0; b < B; ++b)
        for (float v : {1024.f, 1024.f, 0.f, 0.f, 1024.f, 1024.f}) in.time_ids.push_back(v);
    }
    Tensor target = random_tensor({B, n}, DType::F32, 5, s);
    Tensor losses = Tensor::empty({B}, DType::F32, Device::cuda(0), "bench", s);
    auto step = [&] {
      engine.begin_step();
      engine.begin_micro_step(true);
      if (in_backward) engine.set_update_in_backward(1.f);
      models::UNetActivations acts = models::UNetActivations::training(checkpoint);
      Tensor pred = model.forward(in, acts);
      kernels::cuda::mse_forward(s, DType::BF16, losses.data<float>(), pred.data(), target.data<float>(), nullptr, B, n);
      Tensor dpred = Tensor::empty(pred.shape(), DType::BF16, Device::cuda(0), "activations", s);
      kernels::cuda::mse_backward(s, DType::BF16, dpred.data(), pred.data(), target.data<float>(), nullptr, 1.f, B, n);
      pred = Tensor();
      model.backward(dpred, acts);
      engine.finish_gradients();
      const double norm = std::sqrt(engine.grad_norm_squared());
      if (!in_backward) engine.step(float(norm > 1.0 ? 1.0 / norm : 1.0));
      peaks.sample();
    };
    const double secs = timed_iterations(st, s, step);
    const double samples_s = double(B) / secs;
    st.counters["samples_per_s"] = samples_s;
    st.counters["TFLOPs"] = flops_sample * samples_s / 1e12;
    st.counters["MFU_pct"] = 100.0 * flops_sample * samples_s / (cuda_peak_bf16_tflops(0) * 1e12);
    st.counters["peak_engine_GiB"] = peaks.engine_gib();
    st.counters["peak_device_GiB"] = peaks.device_gib();
    st.counters["params_M"] = double(params) / 1e6;
    int64_t trained = 0;
    for (nn::ParamBlock* b : model.trainable_blocks())
      for (const auto& p : b->params()) trained += p->numel();
    st.counters["trainable_M"] = double(trained) / 1e6;
    st.counters["train_GFLOP_per_sample"] = flops_sample / 1e9;
  }
  stream.synchronize();
}

void BM_TrainStepSd15(benchmark::State& st) {
  train_step(st, sd15_config(), st.range(0), 77, st.range(1), st.range(2));
}
void BM_TrainStepSdxl(benchmark::State& st) {
  train_step(st, sdxl_config(), st.range(0), 77, st.range(1), st.range(2));
}
BENCHMARK(BM_TrainStepSd15)->ArgNames({"B", "ckpt", "in_backward"})->ArgsProduct({{8}, {0, 1}, {0, 1}})
    ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);
// SDXL LoRA r=32 on the attention projections (issue 14), beside the full fine-tune above.
void BM_LoraStepSdxl(benchmark::State& st) {
  train_step(st, sdxl_config(), st.range(0), 77, st.range(1), false, st.range(2));
}
BENCHMARK(BM_LoraStepSdxl)->ArgNames({"B", "ckpt", "r"})->ArgsProduct({{2}, {0, 1}, {32}})
    ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_TrainStepSdxl)->ArgNames({"B", "ckpt", "in_backward"})->ArgsProduct({{2}, {0, 1}, {0, 1}})
    ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);

}  // namespace zp::bench

int main(int argc, char** argv) { return zp::bench::run_gpu_benchmarks(argc, argv, "zp_bench_unet"); }
