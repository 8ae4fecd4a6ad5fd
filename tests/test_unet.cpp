// The diffusion UNet: parity with diffusers (tests/golden unet-sd-tiny and unet-sdxl-tiny) on
// the CPU and the GPU, activation checkpointing against the plain forward and backward, several
// micro-batches in flight and inference forwards (caller-owned activations), the sinusoidal time
// embedding, and config errors that name the key.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "app/unet_parity.h"
#include "core/allocator.h"
#include "io/safetensors.h"
#include "io/weight_source.h"
#include "models/activation_estimate.h"
#include "models/unet.h"
#include "models/unet_flops.h"
#include "nn/cross_attention.h"
#include "nn/init.h"
#include "test_util.h"
#include "tiny_unet_config.h"

namespace zp::test {
using nlohmann::json;

// Every tensor held by the parity criterion (app::ParityCriterion): within max(tolerance, 2x
// diffusers' own error on it, from the dump's reference_error.json). In fp32 that is 1e-4 nearly
// everywhere. bf16 stores weights, activations and activation gradients in bf16, and the rounding
// noise (2^-9 per store, a few hundred stores deep) reaches 1-2% on the output and the input
// gradient; parameter gradients, most of all biases and norm parameters (sums over every position,
// with cancellation), carry 2-6%, as diffusers' own bf16 autocast does (its worst 4.8e-2 and 5.4e-2
// on the two dumps), so those bounds come from the file rather than from a flat allowance here.
static void expect_unet_parity(const std::string& model, Device dev, DType dt) {
  const std::string what = model + " " + dev.str() + " " + std::string(dtype_name(dt));
  app::ParityReport r = app::run_unet_parity(golden_path(model), dev, dt, /*print=*/false);
  EXPECT_FALSE(r.criterion().source().empty()) << what << ": the shipped dump has no reference_error.json";
  for (const auto& e : r.entries())
    EXPECT_FALSE(e.fails()) << what << ": " << e.name << " rel_err " << e.rel_error << " > bound " << e.bound;
  // output, input gradient and every parameter gradient, each counted once
  EXPECT_EQ(r.entries().size(), r.criterion().reference_errors().size()) << what;
  EXPECT_GT(r.entries().size(), 100u);
  EXPECT_EQ(r.finish(), 0) << what;
}

TEST(UNet, SdTinyParityCpuFp32) { expect_unet_parity("unet-sd-tiny", Device::cpu(), DType::F32); }
TEST(UNet, SdxlTinyParityCpuFp32) { expect_unet_parity("unet-sdxl-tiny", Device::cpu(), DType::F32); }
// The CPU reference with bf16 storage: the same rounding points as the GPU's bf16 run.
TEST(UNet, SdxlTinyParityCpuBf16) { expect_unet_parity("unet-sdxl-tiny", Device::cpu(), DType::BF16); }

TEST(UNetParityGpu, SdAndSdxlFp32) {
  ZP_SKIP_WITHOUT_GPU();
  expect_unet_parity("unet-sd-tiny", Device::cuda(0), DType::F32);
  expect_unet_parity("unet-sdxl-tiny", Device::cuda(0), DType::F32);
}
TEST(UNetParityGpu, SdAndSdxlBf16) {
  ZP_SKIP_WITHOUT_GPU();
  expect_unet_parity("unet-sd-tiny", Device::cuda(0), DType::BF16);
  expect_unet_parity("unet-sdxl-tiny", Device::cuda(0), DType::BF16);
}

// One forward and backward of a golden model on its reference inputs: what checkpointing must not
// change, and the peak of activation memory above what was held before the forward.
struct GoldenRun {
  std::vector<float> out, dsample;
  std::vector<std::string> names;
  std::vector<std::vector<float>> grads;  // per parameter, as names
  size_t peak_activations = 0;            // bytes
};

static GoldenRun run_golden_unet(const std::string& dir, Device dev, DType dt, bool checkpoint) {
  std::ifstream in(dir + "/config.json");
  const auto cfg = models::UNetConfig::from_hub_json(json::parse(in), dir);
  models::UNet model(cfg, dev, dt);
  model.load(*io::WeightSource::open(dir, "diffusion_pytorch_model"));
  io::SafetensorsFile ref(dir + "/io.safetensors");
  auto host_floats = [&](const std::string& name) { return download(ref.read_as(name, DType::F32)); };
  models::UNetInputs inputs;
  inputs.sample = ref.read_as("input.sample", dt).to(dev);
  inputs.timesteps = host_floats("input.timestep");
  inputs.encoder_hidden_states = ref.read_as("input.encoder_hidden_states", dt).to(dev);
  if (cfg.text_time) {
    inputs.text_embeds = ref.read_as("input.text_embeds", dt).to(dev);
    inputs.time_ids = host_floats("input.time_ids");
  }
  const Tensor dout = ref.read_as("grad_output.sample", dt).to(dev);

  Allocator& alloc = allocator_for(dev);
  const size_t held = alloc.stats().current_by_tag["activations"] + alloc.stats().current_by_tag["saved"];
  alloc.reset_peak();
  GoldenRun r;
  models::UNetActivations acts = models::UNetActivations::training(checkpoint);
  r.out = download(model.forward(inputs, acts));
  r.dsample = download(model.backward(dout, acts));
  // Working memory and what the forward kept for the backward: their peaks, each above what was held.
  r.peak_activations = alloc.stats().peak_by_tag["activations"] + alloc.stats().peak_by_tag["saved"] - held;
  for (nn::Parameter* p : model.parameters()) {
    r.names.push_back(p->name);
    r.grads.push_back(download(p->grad));
  }
  return r;
}

// Checkpointing re-runs the same kernels on the same inputs: the output, the input gradient and every
// parameter gradient are those of the plain run, bit for bit on the CPU (tol = 0) and to `tol` on
// the GPU, where kernels may accumulate in another order from run to run. It must also hold less.
static void expect_checkpointing_changes_nothing(const std::string& model, Device dev, DType dt, double tol) {
  const std::string dir = golden_path(model);
  const GoldenRun plain = run_golden_unet(dir, dev, dt, false), ckpt = run_golden_unet(dir, dev, dt, true);
  const std::string what = model + " " + dev.str() + " " + std::string(dtype_name(dt));
  auto expect_same = [&](const std::vector<float>& a, const std::vector<float>& b, const std::string& name) {
    ASSERT_EQ(a.size(), b.size()) << what << ": " << name;
    if (tol == 0)
      EXPECT_EQ(a, b) << what << ": " << name << " differs with checkpointing";
    else
      EXPECT_LE(rel_error(a, b), tol) << what << ": " << name;
  };
  expect_same(ckpt.out, plain.out, "output");
  expect_same(ckpt.dsample, plain.dsample, "input gradient");
  ASSERT_EQ(ckpt.grads.size(), plain.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i) expect_same(ckpt.grads[i], plain.grads[i], "gradient of " + plain.names[i]);
  EXPECT_LT(ckpt.peak_activations, plain.peak_activations) << what;
  std::printf("%s: peak activation memory %zu bytes plain, %zu checkpointed (%.0f%%)\n", what.c_str(),
              plain.peak_activations, ckpt.peak_activations,
              100.0 * double(ckpt.peak_activations) / double(plain.peak_activations));
}

TEST(UNet, CheckpointingChangesNoGradientSdTinyCpu) {
  expect_checkpointing_changes_nothing("unet-sd-tiny", Device::cpu(), DType::F32, 0);
}
TEST(UNet, CheckpointingChangesNoGradientSdxlTinyCpu) {
  expect_checkpointing_changes_nothing("unet-sdxl-tiny", Device::cpu(), DType::F32, 0);
  expect_checkpointing_changes_nothing("unet-sdxl-tiny", Device::cpu(), DType::BF16, 0);
}
TEST(UNetCheckpointingGpu, ChangesNoGradientSdAndSdxlTiny) {
  ZP_SKIP_WITHOUT_GPU();
  for (const char* model : {"unet-sd-tiny", "unet-sdxl-tiny"}) {
    expect_checkpointing_changes_nothing(model, Device::cuda(0), DType::F32, 1e-6);
    expect_checkpointing_changes_nothing(model, Device::cuda(0), DType::BF16, 1e-2);
  }
}

// ---- Per-call activation state (DESIGN decision 11) on the tiny UNet of the training tests.

// A tiny UNet with random weights and two micro-batches of inputs and output gradients for it.
struct TinyUNetRun {
  models::UNet model;
  models::UNetInputs in[2];
  Tensor dout[2];

  TinyUNetRun(bool sdxl, Device dev, DType dt, const models::LoraSpec& lora = {})
      : model(models::UNetConfig::from_hub_json(tiny_unet_config(sdxl), "tiny_unet_config"), dev, dt, nullptr, 1, true,
              lora) {
    for (nn::Parameter* p : model.parameters()) nn::init_normal(*p, 11, 0.2);
    const models::UNetConfig& cfg = model.config();
    const int64_t B = 2, S = 8, L = 3;
    for (int m = 0; m < 2; ++m) {
      const uint64_t seed = 100 * uint64_t(m + 1);
      models::UNetInputs& x = in[m];
      x.sample = upload(randn(size_t(B * cfg.in_channels * S * S), seed), dt, dev).view({B, cfg.in_channels, S, S});
      x.timesteps = {float(10 + 500 * m), float(999 - 300 * m)};
      x.encoder_hidden_states =
          upload(randn(size_t(B * L * cfg.cross_dim[0]), seed + 1), dt, dev).view({B, L, cfg.cross_dim[0]});
      if (cfg.text_time) {
        x.text_embeds = upload(randn(size_t(B * cfg.text_embeds_dim()), seed + 2), dt, dev)
                            .view({B, cfg.text_embeds_dim()});
        for (int64_t b = 0; b < B; ++b)
          for (float v : {64.f, 64.f, float(8 * m), 0.f, 64.f, 64.f}) x.time_ids.push_back(v);
        EXPECT_EQ(int64_t(x.time_ids.size()), B * models::kTimeIdsPerSample);
      }
      dout[m] = upload(randn(size_t(B * cfg.out_channels * S * S), seed + 3), dt, dev)
                    .view({B, cfg.out_channels, S, S});
    }
  }
  void zero_grads() {
    for (nn::ParamBlock* b : model.blocks()) b->zero_grad();
  }
  // Every block's fp32 gradient buffer.
  std::vector<std::vector<float>> grads() {
    std::vector<std::vector<float>> g;
    for (nn::ParamBlock* b : model.blocks()) g.push_back(download(b->grads()));
    return g;
  }
};

// What one micro-batch's forward and backward give, and the gradient buffers after them.
struct MicroBatchResults {
  std::vector<float> out[2], dsample[2];
  std::vector<std::vector<float>> grads;  // every block's fp32 gradient buffer, accumulated over both
};

// Forward A, forward B, backward B, backward A, each micro-batch in its own UNetActivations, gives
// what running them one after the other gives: the model holds no activations of its own. The
// gradient buffers accumulate the two backwards in the order they run, and the CPU kernels add
// into them as they go, so the sums are bit for bit those of B's backward first (on the CPU, tol =
// 0; GPU kernels may accumulate in another order from run to run) and those of A then B up to the
// rounding of the other order (fp32: 1e-6).
static void expect_interleaved_forwards_match_sequential(bool sdxl, bool checkpoint, Device dev, DType dt,
                                                         double tol) {
  const std::string what = std::string(sdxl ? "SDXL" : "SD") + (checkpoint ? " checkpointed " : " ") + dev.str() +
                           " " + std::string(dtype_name(dt));
  TinyUNetRun run(sdxl, dev, dt);
  models::UNet& m = run.model;
  auto sequential = [&](int first) {
    MicroBatchResults r;
    run.zero_grads();
    for (int i : {first, 1 - first}) {
      models::UNetActivations acts = models::UNetActivations::training(checkpoint);
      r.out[i] = download(m.forward(run.in[i], acts));
      EXPECT_FALSE(acts.empty()) << what;
      r.dsample[i] = download(m.backward(run.dout[i], acts));
      EXPECT_TRUE(acts.empty()) << what << ": a backward consumes its activations";
    }
    r.grads = run.grads();
    return r;
  };
  const MicroBatchResults a_then_b = sequential(0), b_then_a = sequential(1);

  MicroBatchResults inter;
  run.zero_grads();
  models::UNetActivations a = models::UNetActivations::training(checkpoint),
                          b = models::UNetActivations::training(checkpoint);
  inter.out[0] = download(m.forward(run.in[0], a));
  inter.out[1] = download(m.forward(run.in[1], b));
  inter.dsample[1] = download(m.backward(run.dout[1], b));
  inter.dsample[0] = download(m.backward(run.dout[0], a));
  inter.grads = run.grads();

  const auto blocks = m.blocks();
  auto expect_same = [&](const MicroBatchResults& seq, const char* order, double grad_tol) {
    auto same = [&](const std::vector<float>& x, const std::vector<float>& y, double t, const std::string& name) {
      ASSERT_EQ(x.size(), y.size()) << what << ": " << name;
      if (t == 0)
        EXPECT_EQ(x, y) << what << ": " << name << " differs between interleaved micro-batches and " << order;
      else
        EXPECT_LE(rel_error(x, y), t) << what << ": " << name << " against " << order;
    };
    for (int i = 0; i < 2; ++i) {
      const std::string mb = i == 0 ? "A" : "B";
      same(inter.out[i], seq.out[i], tol, "output " + mb);
      same(inter.dsample[i], seq.dsample[i], tol, "input gradient " + mb);
    }
    ASSERT_EQ(inter.grads.size(), seq.grads.size());
    for (size_t i = 0; i < seq.grads.size(); ++i)
      same(inter.grads[i], seq.grads[i], grad_tol, "gradient buffer of block " + blocks[i]->name());
  };
  expect_same(b_then_a, "B then A", tol);
  expect_same(a_then_b, "A then B", std::max(tol, 1e-6));
  for (size_t i = 0; i < blocks.size(); ++i) {
    double norm = 0;
    for (float g : inter.grads[i]) norm += double(g) * g;
    EXPECT_GT(norm, 0) << what << ": block " << blocks[i]->name() << " got no gradient";
  }
}

TEST(UNetActivations, InterleavedForwardsMatchSequentialCpu) {
  for (bool sdxl : {false, true})
    for (bool checkpoint : {false, true})
      expect_interleaved_forwards_match_sequential(sdxl, checkpoint, Device::cpu(), DType::F32, 0);
}
TEST(UNetActivationsGpu, InterleavedForwardsMatchSequential) {
  ZP_SKIP_WITHOUT_GPU();
  for (bool sdxl : {false, true})
    for (bool checkpoint : {false, true}) {
      expect_interleaved_forwards_match_sequential(sdxl, checkpoint, Device::cuda(0), DType::F32, 1e-6);
      expect_interleaved_forwards_match_sequential(sdxl, checkpoint, Device::cuda(0), DType::BF16, 1e-2);
    }
}

// A UNet cut into pipeline chunks (models::UNetSpan), each chunk's boundary fed to the next and the
// boundary gradients back, computes the whole model's prediction bit for bit and its input and
// parameter gradients (within 1e-6; the accumulation order is the whole model's, so on the CPU they
// agree exactly too). The boundaries carry the live skips and the time embedding, whose gradient
// reaches the stem's time-embedding layers from every later chunk: with one unit per chunk, every
// skip of the tiny UNet crosses at least one cut.
static void expect_chunks_chain_to_the_whole_model(bool sdxl) {
  const Device dev = Device::cpu();
  const DType dt = DType::F32;
  TinyUNetRun run(sdxl, dev, dt);
  models::UNet& whole = run.model;
  const models::UNetConfig& cfg = whole.config();
  ASSERT_EQ(cfg.num_units(), 5);
  run.zero_grads();
  models::UNetActivations acts = models::UNetActivations::training();
  const std::vector<float> want_out = download(whole.forward(run.in[0], acts));
  const std::vector<float> want_dsample = download(whole.backward(run.dout[0], acts));
  std::map<std::string, std::vector<float>> want_grads;
  for (nn::ParamBlock* b : whole.blocks()) want_grads[b->name()] = download(b->grads());

  // Uneven cuts (the middle chunk checkpointed), and one unit per chunk.
  for (const std::vector<int64_t>& cuts : {std::vector<int64_t>{0, 1, 4, 5}, {0, 1, 2, 3, 4, 5}}) {
    const std::string what = std::string(sdxl ? "SDXL" : "SD") + " in " + std::to_string(cuts.size() - 1) + " chunks";
    std::vector<std::unique_ptr<models::UNet>> chunks;
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      chunks.push_back(std::make_unique<models::UNet>(cfg, dev, dt, nullptr, 1, true, models::LoraSpec{},
                                                      models::UNetSpan{cuts[k], cuts[k + 1]}));
      for (nn::Parameter* p : chunks.back()->parameters()) nn::init_normal(*p, 11, 0.2);
      for (nn::ParamBlock* b : chunks.back()->blocks()) b->zero_grad();
    }
    EXPECT_TRUE(chunks.front()->has_stem() && !chunks.front()->has_head()) << what;
    EXPECT_TRUE(chunks.back()->has_head() && !chunks.back()->has_stem()) << what;
    EXPECT_EQ(chunks[1]->blocks().size(), size_t(cuts[2] - cuts[1])) << what << ": a middle chunk holds its units only";
    EXPECT_EQ(chunks[1]->blocks().front()->name(), cfg.unit_name(cuts[1])) << what;

    std::vector<models::UNetActivations> chunk_acts;
    Tensor x;
    for (size_t k = 0; k < chunks.size(); ++k) {
      chunk_acts.push_back(models::UNetActivations::training(/*checkpoint=*/k == 1));
      x = chunks[k]->forward(run.in[0], chunk_acts[k], x);
      if (k + 1 == chunks.size()) break;
      int64_t n = 0;
      for (const Shape& sh : cfg.boundary_shapes(cuts[k + 1], 2, 8, 8)) n += shape_numel(sh);
      EXPECT_EQ(x.numel(), n) << what << ": the boundary before unit " << cuts[k + 1];
    }
    EXPECT_EQ(download(x), want_out) << what << ": the prediction, bit for bit";
    Tensor d = run.dout[0];
    for (size_t k = chunks.size(); k-- > 0;) {
      d = chunks[k]->backward(d, chunk_acts[k]);
      ASSERT_TRUE(d.defined()) << what;
    }
    EXPECT_LE(rel_error(download(d), want_dsample), 1e-6) << what << ": the input sample's gradient";
    size_t blocks = 0;
    for (auto& c : chunks)
      for (nn::ParamBlock* b : c->blocks()) {
        ++blocks;
        ASSERT_TRUE(want_grads.count(b->name())) << what << ": " << b->name();
        EXPECT_LE(rel_error(download(b->grads()), want_grads[b->name()]), 1e-6) << what << ": block " << b->name();
      }
    EXPECT_EQ(blocks, want_grads.size()) << what << ": every block in exactly one chunk";
  }
}

TEST(UNetChunks, ChunksChainedAreTheWholeModelSd) { expect_chunks_chain_to_the_whole_model(false); }
TEST(UNetChunks, ChunksChainedAreTheWholeModelSdxl) { expect_chunks_chain_to_the_whole_model(true); }

// ZB-H1's split backward (issue 12): two micro-batches in flight, each backward split into B (the
// input gradient, stem and head gradients) and W (every down, mid and up block's weight gradients),
// run as a pipeline stage runs them (B of the second, B of the first, then W of each in that order)
// give the whole backwards' input gradients (bit for bit on the CPU, tol = 0; to `tol` on the GPU)
// and their gradients: B leaves the units' buffers untouched, the W passes fill them. W reads the
// output gradients and inputs B left it by handle, so the later B and the forwards between must not
// have overwritten them. The norms' weight gradients go through scratch that W adds in (one more
// rounding of the fp32 sums: 1e-6, or `tol` when larger).
static void expect_split_backward_is_the_whole_backward(bool sdxl, bool checkpoint, Device dev, DType dt,
                                                        double tol) {
  const std::string what = std::string(sdxl ? "SDXL" : "SD") + (checkpoint ? " checkpointed " : " ") + dev.str() +
                           " " + std::string(dtype_name(dt));
  const double grad_tol = std::max(tol, 1e-6);
  TinyUNetRun run(sdxl, dev, dt);
  models::UNet& m = run.model;
  auto training = [&] { return models::UNetActivations::training(checkpoint); };
  run.zero_grads();
  std::vector<float> want_dsample[2];
  for (int k : {1, 0}) {
    models::UNetActivations acts = training();
    m.forward(run.in[k], acts);
    want_dsample[k] = download(m.backward(run.dout[k], acts));
  }
  const std::vector<std::vector<float>> want = run.grads();

  run.zero_grads();
  models::UNetActivations acts[2] = {training(), training()};
  models::UNetWeightGrads later[2];
  for (int k : {0, 1}) m.forward(run.in[k], acts[k]);
  for (int k : {1, 0}) {
    const std::vector<float> dsample = download(m.backward(run.dout[k], acts[k], &later[k]));
    if (tol == 0)
      EXPECT_EQ(dsample, want_dsample[k]) << what << ": micro " << k;
    else
      EXPECT_LE(rel_error(dsample, want_dsample[k]), tol) << what << ": micro " << k;
    EXPECT_TRUE(acts[k].empty()) << what;
    EXPECT_EQ(later[k].units.size(), size_t(m.config().num_units())) << what;
  }
  const std::vector<nn::ParamBlock*> blocks = m.blocks();
  const std::vector<std::vector<float>> after_b = run.grads();
  for (size_t i = 0; i < blocks.size(); ++i) {
    const std::string& name = blocks[i]->name();
    if (name == "stem" || name == "head")
      EXPECT_LE(rel_error(after_b[i], want[i]), grad_tol) << what << ": B computes the " << name << "'s gradients";
    else
      EXPECT_EQ(after_b[i], std::vector<float>(after_b[i].size(), 0.f)) << what << ": B wrote into " << name;
  }
  for (int k : {1, 0}) {
    m.backward_weights(later[k]);
    EXPECT_TRUE(later[k].units.empty()) << what;
  }
  const std::vector<std::vector<float>> got = run.grads();
  for (size_t i = 0; i < blocks.size(); ++i)
    EXPECT_LE(rel_error(got[i], want[i]), grad_tol) << what << ": block " << blocks[i]->name();
}

TEST(UNetSplitBackward, IsTheWholeBackwardCpu) {
  for (bool sdxl : {false, true})
    for (bool checkpoint : {false, true})
      expect_split_backward_is_the_whole_backward(sdxl, checkpoint, Device::cpu(), DType::F32, 0);
}
TEST(UNetSplitBackwardGpu, IsTheWholeBackward) {
  ZP_SKIP_WITHOUT_GPU();
  for (bool sdxl : {false, true})
    for (bool checkpoint : {false, true}) {
      expect_split_backward_is_the_whole_backward(sdxl, checkpoint, Device::cuda(0), DType::F32, 1e-6);
      expect_split_backward_is_the_whole_backward(sdxl, checkpoint, Device::cuda(0), DType::BF16, 1e-2);
    }
}

// What crosses each cut of the tiny UNet (16 and 32 channels, one layer per block, 8x8 latents): the
// hidden state, the skips still on the stack (channels-last images), the time embedding.
TEST(UNetChunks, BoundaryShapesFollowTheSkipStack) {
  const models::UNetConfig cfg = models::UNetConfig::from_hub_json(tiny_unet_config(), "tiny_unet_config");
  const int64_t T = cfg.time_embed_dim;
  using Shapes = std::vector<Shape>;
  // After down 0: its output halved; conv_in's output, down 0's resnet, its downsampler's output.
  EXPECT_EQ(cfg.boundary_shapes(1, 2, 8, 8),
            (Shapes{{2, 4, 4, 16}, {2, 8, 8, 16}, {2, 8, 8, 16}, {2, 4, 4, 16}, {2, T}}));
  // After down 1 (no downsampler) and after mid: one more skip, 32 channels at 4x4.
  const Shapes after_down = {{2, 4, 4, 32}, {2, 8, 8, 16}, {2, 8, 8, 16}, {2, 4, 4, 16}, {2, 4, 4, 32}, {2, T}};
  EXPECT_EQ(cfg.boundary_shapes(2, 2, 8, 8), after_down);
  EXPECT_EQ(cfg.boundary_shapes(3, 2, 8, 8), after_down);
  // After up 0: it popped two, upsampled to 8x8.
  EXPECT_EQ(cfg.boundary_shapes(4, 2, 8, 8), (Shapes{{2, 8, 8, 32}, {2, 8, 8, 16}, {2, 8, 8, 16}, {2, T}}));
  EXPECT_EQ(cfg.unit_of_block("stem"), -1);
  EXPECT_EQ(cfg.unit_of_block("mid_block"), 2);
  EXPECT_EQ(cfg.unit_of_block("up_blocks.1.lora"), 4);
  EXPECT_EQ(cfg.unit_of_block("head"), 5);
}


// An inference forward keeps nothing for a backward: no allocation under the "saved" tag (what a
// training forward keeps, nn::Ctx::saved), less memory at its peak than a training forward, and the
// same output (bit for bit on the CPU, tol = 0; to `tol` on the GPU, as in the checkpointing test).
static void expect_inference_saves_nothing(bool sdxl, Device dev, DType dt, double tol) {
  const std::string what = std::string(sdxl ? "SDXL " : "SD ") + dev.str() + " " + std::string(dtype_name(dt));
  TinyUNetRun run(sdxl, dev, dt);
  Allocator& alloc = allocator_for(dev);
  // The peaks of "saved" and of all memory, each above what was held before the forward.
  auto forward = [&](models::UNetActivations& acts, size_t& saved_peak, size_t& total_peak) {
    const MemoryStats before = alloc.stats();
    const size_t held_saved = before.current_by_tag.count("saved") ? before.current_by_tag.at("saved") : 0;
    alloc.reset_peak();
    std::vector<float> out = download(run.model.forward(run.in[0], acts));
    MemoryStats after = alloc.stats();
    saved_peak = after.peak_by_tag["saved"] - held_saved;
    total_peak = after.peak - before.current;
    return out;
  };
  size_t saved_inf = 0, total_inf = 0, saved_train = 0, total_train = 0;
  models::UNetActivations inf = models::UNetActivations::inference();
  const std::vector<float> out_inf = forward(inf, saved_inf, total_inf);
  EXPECT_TRUE(inf.empty()) << what;
  EXPECT_EQ(saved_inf, 0u) << what << ": an inference forward allocated saved activations";
  EXPECT_THROW(run.model.backward(run.dout[0], inf), Error) << what << ": backward of an inference forward";

  models::UNetActivations train = models::UNetActivations::training();
  const std::vector<float> out_train = forward(train, saved_train, total_train);
  EXPECT_FALSE(train.empty()) << what;
  EXPECT_GT(saved_train, 0u) << what << ": a training forward keeps activations under the tag \"saved\"";
  EXPECT_LT(total_inf, total_train) << what;
  if (tol == 0)
    EXPECT_EQ(out_inf, out_train) << what << ": the inference forward runs the same kernels on the same data";
  else
    EXPECT_LE(rel_error(out_inf, out_train), tol) << what;
  EXPECT_THROW(run.model.forward(run.in[1], train), Error) << what << ": a second forward into held activations";
  std::printf("%s: forward peak memory %zu bytes inference, %zu training (%zu of them saved)\n", what.c_str(),
              total_inf, total_train, saved_train);
}

TEST(UNetActivations, InferenceForwardSavesNothingCpu) {
  for (bool sdxl : {false, true}) expect_inference_saves_nothing(sdxl, Device::cpu(), DType::F32, 0);
}
TEST(UNetActivationsGpu, InferenceForwardSavesNothing) {
  ZP_SKIP_WITHOUT_GPU();
  for (bool sdxl : {false, true}) {
    expect_inference_saves_nothing(sdxl, Device::cuda(0), DType::F32, 1e-6);
    expect_inference_saves_nothing(sdxl, Device::cuda(0), DType::BF16, 1e-2);
  }
}

// diffusers' get_timestep_embedding, by hand: flip puts cos first, freq_shift moves the denominator.
TEST(UNet, TimestepEmbeddingMatchesDiffusers) {
  const std::vector<float> t = {0.f, 3.f};
  for (bool flip : {true, false})
    for (double shift : {0.0, 1.0}) {
      auto e = models::timestep_embedding(t, 8, flip, shift);
      ASSERT_EQ(e.size(), 16u);
      for (int b = 0; b < 2; ++b)
        for (int i = 0; i < 4; ++i) {
          double f = std::exp(-std::log(10000.0) * i / (4 - shift));
          double s = std::sin(t[b] * f), c = std::cos(t[b] * f);
          EXPECT_NEAR(e[b * 8 + (flip ? 4 + i : i)], s, 1e-6);
          EXPECT_NEAR(e[b * 8 + (flip ? i : 4 + i)], c, 1e-6);
        }
    }
  auto odd = models::timestep_embedding({5.f}, 5, true, 0);  // odd widths are zero-padded
  EXPECT_EQ(odd[4], 0.f);
}

static json sd_tiny_config() {
  std::ifstream in(golden_path("unet-sd-tiny/config.json"));
  return json::parse(in);
}

// The message of the zp::Error that parsing `j` throws ("" when it parses).
static std::string config_error(const json& j) {
  try {
    models::UNetConfig::from_hub_json(j, "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(UNet, ConfigErrorsNameTheKey) {
  const json base = sd_tiny_config();
  ASSERT_EQ(config_error(base), "");
  auto with = [&](const std::string& key, const json& v) {
    json j = base;
    j[key] = v;
    return config_error(j);
  };
  auto expect_names = [](const std::string& msg, const std::string& key) {
    EXPECT_NE(msg.find("'" + key + "'"), std::string::npos) << "error does not name " << key << ": " << msg;
  };
  expect_names(with("some_new_key", 1), "some_new_key");
  expect_names(with("class_embed_type", "timestep"), "class_embed_type");
  expect_names(with("time_cond_proj_dim", 256), "time_cond_proj_dim");
  expect_names(with("resnet_time_scale_shift", "scale_shift"), "resnet_time_scale_shift");
  expect_names(with("upcast_attention", true), "upcast_attention");
  expect_names(with("dual_cross_attention", true), "dual_cross_attention");
  expect_names(with("addition_embed_type", "text"), "addition_embed_type");
  expect_names(with("attention_type", "gated"), "attention_type");
  expect_names(with("num_attention_heads", 8), "num_attention_heads");
  expect_names(with("time_embedding_type", "fourier"), "time_embedding_type");
  expect_names(with("mid_block_type", "UNetMidBlock2DSimpleCrossAttn"), "mid_block_type");
  expect_names(with("center_input_sample", true), "center_input_sample");
  expect_names(with("encoder_hid_dim", 32), "encoder_hid_dim");
  expect_names(with("down_block_types", {"SimpleCrossAttnDownBlock2D", "DownBlock2D"}), "down_block_types");
  expect_names(with("attention_head_dim", {8, 8, 8}), "attention_head_dim");
  expect_names(with("transformer_layers_per_block", {{1}, {1}}), "transformer_layers_per_block");
  expect_names(with("norm_num_groups", 5), "norm_num_groups");
  expect_names(with("layers_per_block", "two"), "layers_per_block");
  expect_names(with("conv_in_kernel", 4), "conv_in_kernel");
  json no_blocks = base;
  no_blocks.erase("block_out_channels");
  expect_names(config_error(no_blocks), "block_out_channels");
  // text_time needs its two dimensions.
  json sdxl = base;
  sdxl["addition_embed_type"] = "text_time";
  expect_names(config_error(sdxl), "addition_time_embed_dim");
}

// Per-block lists and the SD heads quirk: parameters come out with diffusers' names and shapes.
TEST(UNet, BuildsDiffusersParameterNames) {
  json j = sd_tiny_config();
  j["attention_head_dim"] = {2, 4};
  j["transformer_layers_per_block"] = {1, 2};
  j["down_block_types"] = {"CrossAttnDownBlock2D", "CrossAttnDownBlock2D"};
  j["up_block_types"] = {"CrossAttnUpBlock2D", "CrossAttnUpBlock2D"};
  j["use_linear_projection"] = true;
  models::UNet m(models::UNetConfig::from_hub_json(j, "test"), Device::cpu(), DType::F32);
  ASSERT_NE(m.find("mid_block.attentions.0.transformer_blocks.1.attn2.to_k.weight"), nullptr);
  EXPECT_EQ(m.find("mid_block.attentions.0.transformer_blocks.1.attn2.to_k.weight")->shape, (Shape{32, 16}));
  EXPECT_EQ(m.find("down_blocks.0.attentions.0.proj_in.weight")->shape, (Shape{16, 16}));
  EXPECT_NE(m.find("up_blocks.0.attentions.1.transformer_blocks.1.ff.net.0.proj.weight"), nullptr);
  EXPECT_EQ(m.find("up_blocks.0.resnets.1.conv1.weight")->shape, (Shape{32, 48, 3, 3}));
  EXPECT_EQ(m.find("down_blocks.1.downsamplers.0.conv.weight"), nullptr);  // the last block does not halve
  EXPECT_EQ(m.blocks().size(), 2u + 2u + 1u + 2u);                          // stem, down, mid, up, head
}


// CrossAttention on its own in F64 against finite differences: cross-attention with Tq != Tk and a
// context of another width, both input gradients, and the accumulate flags (the UNet itself only
// uses dx; the text encoder's gradient dcontext is there for training it).
TEST(UNet, CrossAttentionMatchesFiniteDifferences) {
  const int64_t B = 2, T = 3, L = 4, C = 6, Cc = 5, H = 2;
  nn::ParamBlock blk("attn");
  nn::Parameter* q = blk.add("to_q.weight", {C, C}, true);
  nn::Parameter* k = blk.add("to_k.weight", {C, Cc}, true);
  nn::Parameter* v = blk.add("to_v.weight", {C, Cc}, true, true);
  nn::Parameter* ow = blk.add("to_out.0.weight", {C, C}, true);
  nn::Parameter* ob = blk.add("to_out.0.bias", {C}, false);
  blk.allocate(Device::cpu(), DType::F64);
  auto fill = [](nn::Parameter* p, uint64_t seed) {
    auto r = randn(size_t(p->numel()), seed, 0.5f);
    std::copy(r.begin(), r.end(), p->value.data<double>());
  };
  fill(q, 1), fill(k, 2), fill(v, 3), fill(ow, 4), fill(ob, 5);
  nn::CrossAttention attn(nn::Linear(q, nullptr), nn::Linear({k, v}, {}), nn::Linear(ow, ob), H);
  nn::Ctx c;
  c.dt = DType::F64;
  auto xr = randn(size_t(B * T * C), 6), cr = randn(size_t(B * L * Cc), 7), gr = randn(size_t(B * T * C), 8);
  std::vector<double> x(xr.begin(), xr.end()), ctx(cr.begin(), cr.end()), g(gr.begin(), gr.end());
  auto loss = [&] {
    nn::CrossAttention::Saved sv;
    std::vector<double> y(g.size());
    attn.forward(c, y.data(), x.data(), B, T, ctx.data(), L, sv);
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += y[i] * g[i];
    return l;
  };
  nn::CrossAttention::Saved sv;
  std::vector<double> y(g.size()), dx(x.size(), 1.0), dctx(ctx.size(), 1.0);
  attn.forward(c, y.data(), x.data(), B, T, ctx.data(), L, sv);
  auto tensor = [](const std::vector<double>& v) {  // the backward holds its inputs by handle
    Tensor t = Tensor::empty({int64_t(v.size())}, DType::F64, Device::cpu(), "test");
    std::copy(v.begin(), v.end(), t.data<double>());
    return t;
  };
  attn.backward(c, dx.data(), dctx.data(), tensor(g), tensor(x), tensor(ctx), B, T, L, sv, true, true);
  for (double& d : dx) d -= 1.0;  // accumulated onto ones
  for (double& d : dctx) d -= 1.0;
  expect_grad_matches_fd(x, dx, loss, "dx");
  expect_grad_matches_fd(ctx, dctx, loss, "dcontext");
  std::vector<double> kw(k->value.data<double>(), k->value.data<double>() + k->numel());
  std::vector<double> kg(k->g(), k->g() + k->numel());
  auto loss_k = [&] {
    std::copy(kw.begin(), kw.end(), k->value.data<double>());
    return loss();
  };
  expect_grad_matches_fd(kw, kg, loss_k, "to_k.weight");
}

}  // namespace zp::test

namespace zp::test {

// The plan's activation estimate (models/activation_estimate.h) against the memory one training
// micro-batch really takes at its peak, forward and backward (the checkpointed re-runs included),
// above what was held before: within a factor of two either way.
// With LoRA (adapters with dropout on attention, projections and the ResBlocks' convolutions, the
// base frozen) as well.
TEST(ActivationEstimate, UNetIsWithinTwiceWhatAStepTakes) {
  for (bool lora : {false, true})
    for (bool sdxl : {false, true})
      for (bool checkpoint : {false, true}) {
        const std::string what =
            std::string(sdxl ? "SDXL" : "SD") + (checkpoint ? " checkpointed" : "") + (lora ? " LoRA" : "");
        models::LoraSpec spec;
        if (lora) spec = {4, 8, 0.1, {"to_q", "to_k", "to_v", "to_out.0", "proj_in", "conv1", "conv2"}, false};
        TinyUNetRun run(sdxl, Device::cpu(), DType::F32, spec);
        if (lora) run.in[0].dropout = {0x77, 0, run.in[0].sample.shape()[0]};
        Allocator& alloc = allocator_for(Device::cpu());
        const size_t held = alloc.stats().current;
        alloc.reset_peak();
        {
          models::UNetActivations acts = models::UNetActivations::training(checkpoint);
          Tensor out = run.model.forward(run.in[0], acts);
          run.model.backward(run.dout[0], acts);
        }
        const double measured = double(alloc.stats().peak - held);
        const models::UNetInputs& x = run.in[0];
        const double estimate = models::unet_activation_bytes(run.model, x.sample.shape()[0], x.sample.shape()[2],
                                                              x.sample.shape()[3], x.encoder_hidden_states.shape()[1],
                                                              DType::F32, checkpoint);
        expect_estimate_within_twice(what, estimate, measured);
      }
}

}  // namespace zp::test

namespace zp::test {

// The UNet's training FLOPs by hand on the tiny SD config (16 then 32 channels, 8x8 latents, 3 text
// tokens) with LoRA r=4 on to_q and conv1: a frozen base weight counts its forward and input
// gradient (2 x 2 x weight x positions), a trained one and every adapter add the weight gradient
// (3 x), attention's scores and weighted values count 3 x 4 x T x Tk x channels.
TEST(UNetFlops, AdaptersAndAFrozenBaseCountByHand) {
  const models::UNetConfig cfg = models::UNetConfig::from_hub_json(tiny_unet_config(false), "tiny_unet_config");
  const models::LoraSpec spec{4, 8, 0.0, {"to_q", "conv1"}, false};
  models::UNet plain(cfg, Device::cpu(), DType::F32, nullptr, 1, false);
  models::UNet lora(cfg, Device::cpu(), DType::F32, nullptr, 1, false, spec);
  const int64_t H = 8, W = 8, L = 3;
  auto flops = [&](models::UNet& m, const std::string& name, const Shape& shape) {
    nn::Parameter* p = m.find(name);
    EXPECT_TRUE(p) << name;
    if (!p) return 0.0;
    EXPECT_EQ(p->shape, shape) << name;
    return models::unet_train_flops_per_sample(cfg, {p}, H, W, L);
  };
  const std::string q1 = "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q";
  const std::string q2 = "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_q";
  const std::string conv = "down_blocks.1.resnets.0.conv1";  // 16 -> 32 at 4 x 4
  const double self_scores = 3.0 * 4 * 64 * 64 * 16, cross_scores = 3.0 * 4 * 64 * L * 16;
  EXPECT_DOUBLE_EQ(flops(plain, q1 + ".weight", {16, 16}), 3.0 * 2 * 16 * 16 * 64 + self_scores);
  EXPECT_DOUBLE_EQ(flops(lora, q1 + ".weight", {16, 16}), 2.0 * 2 * 16 * 16 * 64 + self_scores);
  EXPECT_DOUBLE_EQ(flops(lora, q2 + ".weight", {16, 16}), 2.0 * 2 * 16 * 16 * 64 + cross_scores);
  EXPECT_DOUBLE_EQ(flops(lora, q1 + ".lora_A.weight", {4, 16}), 3.0 * 2 * 4 * 16 * 64);
  EXPECT_DOUBLE_EQ(flops(lora, q1 + ".lora_B.weight", {16, 4}), 3.0 * 2 * 16 * 4 * 64);
  EXPECT_DOUBLE_EQ(flops(plain, conv + ".weight", {32, 16, 3, 3}), 3.0 * 2 * 32 * 16 * 9 * 16);
  EXPECT_DOUBLE_EQ(flops(lora, conv + ".weight", {32, 16, 3, 3}), 2.0 * 2 * 32 * 16 * 9 * 16);
  EXPECT_DOUBLE_EQ(flops(lora, conv + ".lora_A.weight", {4, 16, 3, 3}), 3.0 * 2 * 4 * 16 * 9 * 16);
  EXPECT_DOUBLE_EQ(flops(lora, conv + ".lora_B.weight", {32, 4, 1, 1}), 3.0 * 2 * 32 * 4 * 16);

  // The whole model: the plain model's count, less every base weight's gradient, plus the adapters'.
  double base_weight_grads = 0, adapters = 0;
  for (nn::Parameter* p : lora.parameters()) {
    if (p->shape.size() < 2) continue;
    const double one = models::unet_train_flops_per_sample(cfg, {p}, H, W, L);
    if (p->frozen) {
      nn::Parameter* same = plain.find(p->name);
      ASSERT_TRUE(same) << p->name;
      base_weight_grads += models::unet_train_flops_per_sample(cfg, {same}, H, W, L) - one;
    } else {
      adapters += one;
    }
  }
  EXPECT_GT(adapters, 0.0);
  EXPECT_NEAR(models::unet_train_flops_per_sample(lora, H, W, L),
              models::unet_train_flops_per_sample(plain, H, W, L) - base_weight_grads + adapters,
              1e-12 * models::unet_train_flops_per_sample(plain, H, W, L));
}

// LoRA's adapters keep no activations of their own: the estimate is the plain model's.
TEST(ActivationEstimate, UNetAdaptersKeepNothingOfTheirOwn) {
  const models::UNetConfig cfg = models::UNetConfig::from_hub_json(tiny_unet_config(true), "tiny_unet_config");
  models::UNet plain(cfg, Device::cpu(), DType::F32, nullptr, 1, false);
  models::UNet lora(cfg, Device::cpu(), DType::F32, nullptr, 1, false,
                    {4, 8, 0.1, {"to_q", "to_k", "proj_in", "conv1", "conv_shortcut"}, false});
  for (bool checkpoint : {false, true})
    EXPECT_EQ(models::unet_activation_bytes(lora, 2, 8, 8, 3, DType::BF16, checkpoint),
              models::unet_activation_bytes(plain, 2, 8, 8, 3, DType::BF16, checkpoint));
}

}  // namespace zp::test
