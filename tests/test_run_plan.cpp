// Memory plans (issue 11 item 5): the exact model-state counts per tier, host-memory probing, the
// `zeropipe plan` verdicts on the shipped presets and that its suggested change really fits.
#include <gtest/gtest.h>

#include <filesystem>
#include <tuple>

#include "app/plan_command.h"
#include "core/cpu_share.h"
#include "core/host_memory.h"
#include "models/activation_estimate.h"
#include "io/config.h"
#include "models/transformer.h"
#include "models/unet.h"
#include "parallel/host_state_store.h"
#include "parallel/memory_plan.h"
#include "parallel/nvme_parameter_shards.h"
#include "parallel/zero_engine.h"
#include "runtime/diffusion_config.h"
#include "runtime/lora_run.h"
#include "runtime/optimizer_step.h"
#include "runtime/pipeline_chunks.h"
#include "runtime/run_plan.h"
#include "test_util.h"
#include "tiny_llama_config.h"

namespace zp::test {
namespace fs = std::filesystem;
using parallel::ShardingPolicy;

namespace {

const fs::path kConfigs = fs::path(__FILE__).parent_path().parent_path() / "configs";

// Runs `zeropipe plan` and returns its exit status and output.
int plan(const std::string& preset, std::vector<std::string> sets, int world, const std::string& gpu,
         const std::string& host, std::string& out, const std::string& nvme = "") {
  app::PlanOptions o;
  o.config = (kConfigs / preset).string();
  o.sets = std::move(sets);
  o.world = world;
  o.gpu_memory = gpu;
  o.host_memory = host;
  o.nvme_free = nvme;
  testing::internal::CaptureStdout();
  const int status = app::run_plan(o);
  out = testing::internal::GetCapturedStdout();
  return status;
}

// The --set assignments of a "cheapest change" line.
std::vector<std::string> suggested_sets(const std::string& out) {
  std::vector<std::string> sets;
  for (size_t at = out.find("--set "); at != std::string::npos; at = out.find("--set ", at + 1)) {
    const size_t from = at + 6, to = out.find_first_of(" \n", from);
    sets.push_back(out.substr(from, to - from));
  }
  return sets;
}

// A preset with `sets` as `zeropipe plan` reads it, resolved for `world` ranks.
runtime::TrainConfig preset_config(const std::string& preset, const std::vector<std::string>& sets, int world,
                                   bool& unet) {
  io::Config c = io::Config::from_file(runtime::train_schema_with_diffusion(), (kConfigs / preset).string(),
                                       io::Config::OnProblem::Keep);
  for (const std::string& s : sets) c.set(s);
  unet = c.get<std::string>("model.type") == "unet";
  const runtime::TrainConfig t = unet ? runtime::UNetTrainConfig::from(c).common : runtime::TrainConfig::from(c);
  return t.resolve_for_place(world / int(t.pipeline_stages), world, Device::cpu());
}

}  // namespace

TEST(RunPlan, ParsesSizes) {
  EXPECT_EQ(app::parse_bytes("24GiB", "x"), 24.0 * (1 << 30));
  EXPECT_EQ(app::parse_bytes("64GB", "x"), 64e9);
  EXPECT_EQ(app::parse_bytes("1.5 TiB", "x"), 1.5 * 1099511627776.0);
  EXPECT_EQ(app::parse_bytes("4096", "x"), 4096.0);
  const std::string m = error_message([] { app::parse_bytes("24 gigs", "--gpu-memory"); });
  EXPECT_NE(m.find("--gpu-memory '24 gigs'"), std::string::npos) << m;
  EXPECT_NE(error_message([] { app::parse_bytes("-3GiB", "--host-memory"); }), "");
}

TEST(RunPlan, HostMemoryIsMemAvailableCappedByTheCgroup) {
  const std::string meminfo = "MemTotal:       65536000 kB\nMemFree:         1000000 kB\nMemAvailable:   50000000 kB\n";
  HostMemory m = available_host_memory_from(meminfo, "", "");
  EXPECT_EQ(m.available, int64_t(50000000) * 1024);
  EXPECT_EQ(m.source, "MemAvailable");
  m = available_host_memory_from(meminfo, "max\n", "123\n");
  EXPECT_EQ(m.available, int64_t(50000000) * 1024) << "no cgroup limit";
  m = available_host_memory_from(meminfo, "17179869184\n", "4294967296\n");
  EXPECT_EQ(m.available, int64_t(12) << 30) << "16 GiB limit, 4 GiB used";
  EXPECT_NE(m.source.find("cgroup"), std::string::npos);
  EXPECT_EQ(available_host_memory_from("", "", "").available, -1);
  EXPECT_GT(available_host_memory().available, 0) << "this machine has /proc/meminfo";
}

// The counts by hand for a laid-out tiny Llama on 4 ranks at stage 3 with both offload tiers.
TEST(RunPlan, ModelStatesPerTierAreCountedExactly) {
  const int world = 4;
  auto cfg = models::TransformerConfig::from_hub_json(tiny_llama(), "plan-test");
  models::Transformer m(cfg, Device::cpu(), DType::BF16, nullptr, parallel::shard_pad_multiple(world), false);
  int64_t psi = 0, largest = 0;
  for (nn::ParamBlock* b : m.blocks()) {
    psi += b->padded();
    largest = std::max(largest, b->padded());
  }
  const double shard = double(psi) / world;
  ShardingPolicy p = ShardingPolicy::from_config(3, "cpu", "cpu");
  parallel::MemoryPlan gpu = parallel::plan_memory(m.blocks(), p, world, false, /*gpu=*/true);
  EXPECT_EQ(gpu.params, psi);
  EXPECT_DOUBLE_EQ(gpu.param_bytes, 2.0 * double(largest) * 2) << "only the gathered blocks in flight";
  EXPECT_DOUBLE_EQ(gpu.host_param_bytes, shard * 2);
  EXPECT_DOUBLE_EQ(gpu.grad_bytes, (shard + 2.0 * double(largest)) * 4);
  EXPECT_DOUBLE_EQ(gpu.optimizer_bytes, 0);
  EXPECT_DOUBLE_EQ(gpu.host_optimizer_bytes, shard * 12);
  EXPECT_DOUBLE_EQ(gpu.host_staging_bytes,
                   double(parallel::HostStateStore::staging_bytes_for(largest / world, DType::BF16)));
  EXPECT_TRUE(gpu.host_pinned);
  // On CPUs the host tiers are the device's memory: nothing is staged or pinned twice.
  parallel::MemoryPlan cpu = parallel::plan_memory(m.blocks(), p, world, false, /*gpu=*/false);
  EXPECT_DOUBLE_EQ(cpu.host_param_bytes, 0);
  EXPECT_DOUBLE_EQ(cpu.param_bytes, (shard + 2.0 * double(largest)) * 2);
  EXPECT_DOUBLE_EQ(cpu.host_staging_bytes, 0);
  EXPECT_FALSE(cpu.host_pinned);
  // Stage 1 on the device: the replicated parameters and gradients, a quarter of the optimizer state.
  parallel::MemoryPlan s1 = parallel::plan_memory(m.blocks(), ShardingPolicy::zero_stage(1), world, false, true);
  EXPECT_DOUBLE_EQ(s1.device_bytes(), double(psi) * 2 + double(psi) * 4 + shard * 12);
  EXPECT_DOUBLE_EQ(s1.host_bytes(), 0);

  // The delayed update's double buffers: the owned fp32 gradients on the device, the owned bf16
  // weights beside the shards (host memory with the parameter tier, else the device), in the totals
  // and in the banner line.
  ShardingPolicy delayed = p;
  delayed.set_delayed_update(true);
  parallel::MemoryPlan dgpu = parallel::plan_memory(m.blocks(), delayed, world, false, /*gpu=*/true);
  EXPECT_DOUBLE_EQ(dgpu.delayed_update_bytes, shard * 4);
  EXPECT_DOUBLE_EQ(dgpu.host_delayed_update_bytes, shard * 2);
  EXPECT_DOUBLE_EQ(dgpu.device_bytes(), gpu.device_bytes() + shard * 4);
  EXPECT_DOUBLE_EQ(dgpu.host_bytes(), gpu.host_bytes() + shard * 2);
  EXPECT_NE(dgpu.str().find("the delayed update's second gradient and weight buffers"), std::string::npos) << dgpu.str();
  ShardingPolicy delayed_s2 = ShardingPolicy::from_config(2, "cpu", "none");
  delayed_s2.set_delayed_update(true);
  parallel::MemoryPlan d2 = parallel::plan_memory(m.blocks(), delayed_s2, world, false, /*gpu=*/true);
  EXPECT_DOUBLE_EQ(d2.delayed_update_bytes, shard * (4 + 2));
  EXPECT_DOUBLE_EQ(d2.host_delayed_update_bytes, 0);
  EXPECT_EQ(gpu.delayed_update_bytes + gpu.host_delayed_update_bytes, 0) << "nothing without the delayed update";

  // offload_optimizer.ratio: the leading ranges the policy keeps on the device count there, the rest
  // in host memory (or on NVMe), and the staging ring is sized to the offloaded ranges.
  ShardingPolicy partial = p;
  partial.set_offload_ratio(0.5);
  std::vector<int64_t> ranges;
  for (nn::ParamBlock* b : m.blocks()) ranges.push_back(b->padded() / world);
  const std::vector<char> kept = partial.keeps_on_device(ranges);
  double on_device = 0, largest_off = 0;
  for (size_t i = 0; i < ranges.size(); ++i)
    if (kept[i]) on_device += double(ranges[i]);
    else largest_off = std::max(largest_off, double(ranges[i]));
  ASSERT_GT(on_device, 0) << "the tiny model splits at ratio 0.5";
  ASSERT_LT(on_device, shard);
  parallel::MemoryPlan half = parallel::plan_memory(m.blocks(), partial, world, false, /*gpu=*/true);
  EXPECT_DOUBLE_EQ(half.optimizer_bytes, on_device * 12);
  EXPECT_DOUBLE_EQ(half.host_optimizer_bytes, (shard - on_device) * 12);
  EXPECT_DOUBLE_EQ(half.host_staging_bytes,
                   double(parallel::HostStateStore::staging_bytes_for(int64_t(largest_off), DType::BF16)));
  ShardingPolicy partial_nvme = ShardingPolicy::from_config(2, "nvme", "none");
  partial_nvme.set_offload_ratio(0.5);
  parallel::MemoryPlan half_nvme = parallel::plan_memory(m.blocks(), partial_nvme, world, false, true);
  EXPECT_DOUBLE_EQ(half_nvme.optimizer_bytes, on_device * 12);
  EXPECT_GE(half_nvme.nvme_optimizer_bytes, (shard - on_device) * 12);
  EXPECT_LT(half_nvme.nvme_optimizer_bytes, shard * 12);
}

// The parameter shards on NVMe: off the device (and out of host memory), in the swap file (one
// aligned extent per block), with the tier's buffers as host staging.
TEST(RunPlan, NvmeParameterShardsAreCounted) {
  const int world = 4;
  auto cfg = models::TransformerConfig::from_hub_json(tiny_llama(), "plan-test");
  models::Transformer m(cfg, Device::cpu(), DType::BF16, nullptr, parallel::shard_pad_multiple(world), false);
  int64_t largest = 0, psi = 0;
  std::vector<int64_t> shard_bytes;
  for (nn::ParamBlock* b : m.blocks()) {
    largest = std::max(largest, b->padded());
    psi += b->padded();
    shard_bytes.push_back(b->padded() / world * 2);
  }
  ShardingPolicy p = ShardingPolicy::from_config(3, "none", "nvme");
  parallel::NvmeSettings nvme{"/local_nvme", 1 << 20, 8, 3};
  p.set_parameter_nvme(nvme);
  for (bool gpu : {true, false}) {
    parallel::MemoryPlan s = parallel::plan_memory(m.blocks(), p, world, false, gpu);
    EXPECT_DOUBLE_EQ(s.param_bytes, 2.0 * double(largest) * 2) << "only the gathered blocks in flight";
    EXPECT_DOUBLE_EQ(s.host_param_bytes, 0);
    EXPECT_DOUBLE_EQ(s.nvme_param_bytes, double(parallel::NvmeParameterShards::file_bytes_for(shard_bytes)));
    EXPECT_GE(s.nvme_param_bytes, double(psi) / world * 2);
    EXPECT_DOUBLE_EQ(s.nvme_bytes(), s.nvme_param_bytes);
    EXPECT_DOUBLE_EQ(s.host_staging_bytes,
                     double(parallel::NvmeParameterShards::buffer_bytes_for(largest / world * 2, 3)));
    EXPECT_NE(s.str().find("on NVMe under /local_nvme: parameters"), std::string::npos) << s.str();
  }
}

// `zeropipe plan --nvme-free`: the preset with both tiers on NVMe, against a disk too small for the
// node's swap files (named, with the change that fits) and one large enough.
TEST(RunPlan, PlanCommandChecksTheNvmeSpace) {
  std::string out;
  EXPECT_EQ(plan("zero3-offload-nvme.json", {}, 2, "", "", out, "1GiB"), 1) << out;
  EXPECT_NE(out.find("parameter shards"), std::string::npos) << out;
  EXPECT_NE(out.find("optimizer state"), std::string::npos) << out;
  EXPECT_NE(out.find("of 1.0 GiB free: DOES NOT FIT"), std::string::npos) << out;
  EXPECT_NE(out.find("does not fit: NVMe per node (2 ranks' swap files)"), std::string::npos) << out;
  const std::vector<std::string> sets = suggested_sets(out);
  ASSERT_FALSE(sets.empty()) << out;
  EXPECT_NE(std::find(sets.begin(), sets.end(), "zero_optimization.offload_optimizer.device=cpu"), sets.end()) << out;
  // Changes the fit does not need are dropped again: more stages would not shrink the node's swap files.
  EXPECT_EQ(out.find("pipeline.stages"), std::string::npos) << out;
  EXPECT_EQ(plan("zero3-offload-nvme.json", sets, 2, "", "", out, "1GiB"), 0) << "the suggestion fits:\n" << out;
  EXPECT_EQ(plan("zero3-offload-nvme.json", {}, 2, "", "", out, "1TiB"), 0) << out;
  EXPECT_NE(out.find("fits"), std::string::npos) << out;
  test::expect_error([] { app::parse_bytes("lots", "--nvme-free"); }, {"--nvme-free 'lots'"});
}

TEST(RunPlan, MisfitsNameTheTierAndTheBytes) {
  runtime::RunPlan p;
  p.states.param_bytes = 10e9;
  p.states.host_optimizer_bytes = 20e9;
  p.states.host_pinned = true;
  p.activation_bytes = 5e9;
  p.ranks_per_node = 4;
  auto bad = runtime::misfits(p, {12e9, 100e9});
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].tier, "GPU memory per rank");
  EXPECT_DOUBLE_EQ(bad[0].need, 10e9 + 5e9 + runtime::kRuntimeAllowanceBytes);
  EXPECT_TRUE(runtime::misfits(p, {12e9, 100e9}, /*states_only=*/true).empty())
      << "the start-up check stops a run on exact counts only";
  bad = runtime::misfits(p, {-1, 64e9});
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].tier, "host memory per node (4 ranks)");
  EXPECT_DOUBLE_EQ(bad[0].need, 80e9);
}

// The README's plans: SDXL on the five 24 GB cards of a 64 GB node fits with the shipped preset, and
// the same node cannot hold SDXL at stage 0; Llama 8B at stage 0 does not fit four 48 GB cards, and
// the change `zeropipe plan` suggests does fit when applied.
TEST(RunPlan, PlanCommandOnThePresets) {
  std::string out;
  EXPECT_EQ(plan("sdxl-unet-zero3-offload.json", {}, 5, "24GiB", "64GiB", out), 0) << out;
  EXPECT_NE(out.find("fits"), std::string::npos) << out;
  EXPECT_NE(out.find("UNet, 2.57B parameters"), std::string::npos) << out;
  // The README's consumer node as five pipeline stages: it fits, judged by its worst stage.
  EXPECT_EQ(plan("sdxl-unet-pipeline.json", {}, 5, "24GiB", "64GiB", out), 0) << out;
  EXPECT_NE(out.find("\nfits\n"), std::string::npos) << out;
  EXPECT_NE(out.find("worst stage 3: memory plan (ZeRO stage 2, 1 rank"), std::string::npos) << out;
  // Without the offload the worst stage's optimizer state does not fit its card.
  EXPECT_EQ(plan("sdxl-unet-pipeline.json", {"zero_optimization.offload_optimizer.device=none"}, 5, "24GiB", "64GiB",
                 out), 1) << out;
  EXPECT_NE(out.find("does not fit: GPU memory per rank (stage 3)"), std::string::npos) << out;
  EXPECT_NE(out.find("zero_optimization.offload_optimizer.device=cpu"), std::string::npos) << out;
  EXPECT_EQ(plan("sdxl-unet.json", {}, 5, "24GiB", "64GiB", out), 1) << out;
  EXPECT_NE(out.find("does not fit: GPU memory per rank"), std::string::npos) << out;

  EXPECT_EQ(plan("llama-8b.json", {}, 4, "48GiB", "256GiB", out), 1) << out;
  EXPECT_NE(out.find("cheapest change"), std::string::npos) << out;
  const std::vector<std::string> sets = suggested_sets(out);
  ASSERT_FALSE(sets.empty()) << out;
  EXPECT_EQ(plan("llama-8b.json", sets, 4, "48GiB", "256GiB", out), 0) << "the suggestion fits:\n" << out;
  // No GPU or host sizes: the plan alone, status 0.
  EXPECT_EQ(plan("llama-8b.json", {}, 4, "", "", out), 0) << out;
  EXPECT_NE(out.find("give --gpu-memory"), std::string::npos) << out;
}

// More pipeline stages are one of the changes `zeropipe plan` weighs (issue 12), after ZeRO-2 and
// before ZeRO-3: Llama 8B at ZeRO-2 with checkpointing on four cards that hold a stage of a two-stage
// pipeline but not the whole model gets pipeline.stages=2 with the accumulation doubled (the same
// global batch), which fits when applied; on one rank, or with an explicit cut, no more stages are
// proposed.
TEST(RunPlan, PlanCommandSuggestsMorePipelineStages) {
  const std::vector<std::string> given = {"zero_optimization.stage=2", "model.activation_checkpointing=true"};
  std::vector<std::string> staged = given;
  staged.insert(staged.end(), {"pipeline.stages=2", "gradient_accumulation_steps=64"});
  bool unet = false;
  const double whole = runtime::plan_pipeline(preset_config("llama-8b.json", given, 4, unet), false, 4, 4)
                           .stages[0].plan.gpu_bytes();
  const runtime::PipelinePlan two = runtime::plan_pipeline(preset_config("llama-8b.json", staged, 4, unet), false, 4, 4);
  const double stage = two.stages[two.worst_stage()].plan.gpu_bytes();
  ASSERT_LT(stage, whole) << "two stages of Llama 8B must need less per card than the whole model";
  const std::string gpu = std::to_string(int64_t(stage) + 1);
  std::string out;
  EXPECT_EQ(plan("llama-8b.json", given, 4, gpu, "1TiB", out), 1) << out;
  EXPECT_NE(out.find("cheapest change that fits: --set pipeline.stages=2 --set gradient_accumulation_steps=64\n"),
            std::string::npos)
      << out;
  std::vector<std::string> applied = given;
  for (const std::string& s : suggested_sets(out)) applied.push_back(s);
  EXPECT_EQ(plan("llama-8b.json", applied, 4, gpu, "1TiB", out), 0) << "the suggestion fits:\n" << out;
  // One rank has no second stage to give; an explicit cut is the user's for its stages.
  EXPECT_EQ(plan("llama-8b.json", given, 1, gpu, "1TiB", out), 1) << out;
  EXPECT_EQ(out.find("pipeline.stages"), std::string::npos) << out;
  std::vector<std::string> cut = staged;
  cut.push_back("pipeline.partition=[16]");
  EXPECT_EQ(plan("llama-8b.json", cut, 4, std::to_string(int64_t(stage / 2)), "1TiB", out), 1) << out;
  EXPECT_EQ(out.find("--set pipeline.stages"), std::string::npos) << out;
}

// With pipeline.stages P (issue 12) each stage is planned alone: its blocks (the embedding on the
// first, the head on the last), ZeRO within its world / P ranks, the micro-batches its schedule keeps
// in flight. The stages' parameters add up to the whole model's (a tied head's replica of the
// embedding block once more, on the last stage).
TEST(RunPlan, PipelinedLanguageModelsArePlannedPerStage) {
  for (const auto& [preset, P, world] : {std::tuple<std::string, int, int>{"llama-8b.json", 4, 8},
                                         {"gpt2-124m.json", 3, 3}}) {
    bool unet = true;
    const runtime::TrainConfig tc =
        preset_config(preset, {"pipeline.stages=" + std::to_string(P), "gradient_accumulation_steps=" + std::to_string(P),
                               "zero_optimization.stage=2", "pipeline.partition=\"uniform\""}, world, unet);
    ASSERT_FALSE(unet);
    const runtime::PipelinePlan p = runtime::plan_pipeline(tc, false, world, world);
    ASSERT_EQ(p.stages.size(), size_t(P)) << preset;
    std::string source;
    const models::TransformerConfig mc = models::TransformerConfig::from_hub_json(tc.hub_config_json(source), source);
    // The whole model on the data-parallel ranks of one stage.
    const runtime::RunPlan whole = runtime::plan_config(tc, false, world / P, world / P);
    int64_t params = 0, trained = 0;
    for (int s = 0; s < P; ++s) {
      const runtime::StagePlan& st = p.stages[size_t(s)];
      params += st.params;
      trained += st.plan.trained_params;
      EXPECT_EQ(st.plan.states.world, world / P) << preset << " stage " << s << ": ZeRO within the stage's ranks";
      EXPECT_EQ(st.plan.states.stage, 2);
      EXPECT_EQ(st.holds.find("embedding") != std::string::npos, s == 0) << st.holds;
      EXPECT_EQ(st.holds.find("head") != std::string::npos, s == P - 1) << st.holds;
      EXPECT_LT(st.plan.states.device_bytes(), whole.states.device_bytes()) << preset << " stage " << s;
    }
    // A tied head's replica is the embedding block: GPT-2's position embedding rides along.
    const int64_t replica = mc.tied ? (mc.vocab + (mc.learned_positions ? mc.max_positions : 0)) * mc.hidden : 0;
    EXPECT_EQ(params, mc.num_parameters() + replica) << preset;
    EXPECT_EQ(trained, params) << preset;
    // 1F1B: stage s keeps P - s micro-batches of its layers (uniform: the same count on the first two).
    const int64_t per = mc.layers / P;
    const double first = models::transformer_activation_bytes(mc, tc.micro_batch, tc.seq_len, tc.dtype,
                                                              tc.activation_checkpointing, {0, per, true, false});
    EXPECT_DOUBLE_EQ(p.stages[0].plan.activation_bytes, P * first) << preset;
    EXPECT_DOUBLE_EQ(p.stages[1].plan.activation_bytes, (P - 1) * first) << preset;
    EXPECT_EQ(p.worst_stage(), 0u) << preset << ": the embedding's and P micro-batches' stage";
    // Every cut carries one micro-batch's hidden state, [B * T, hidden] in the compute dtype.
    ASSERT_EQ(p.cut_bytes.size(), size_t(P - 1)) << preset;
    for (double bytes : p.cut_bytes)
      EXPECT_DOUBLE_EQ(bytes, double(tc.micro_batch * tc.seq_len * mc.hidden * dtype_size(tc.dtype))) << preset;
    const std::string report = runtime::plan_report(p, {});
    EXPECT_NE(report.find("pipeline: " + std::to_string(P) + " stages (1f1b"), std::string::npos) << report;
    EXPECT_NE(report.find("worst stage 0: memory plan (ZeRO stage 2"), std::string::npos) << report;
    EXPECT_NE(report.find("  across cuts    " + runtime::format_bytes(p.cut_bytes[0]) + " | "), std::string::npos)
        << report;
  }
  {
    // Interleaved, V = 2: 2P - 1 cuts between the 2P chunks, the wrap from the last stage to the first among them.
    bool is_unet = true;
    const runtime::TrainConfig tc = preset_config(
        "gpt2-124m.json", {"pipeline.stages=3", "gradient_accumulation_steps=6", "pipeline.schedule=\"interleaved\"",
                           "pipeline.virtual_stages=2"}, 3, is_unet);
    EXPECT_EQ(runtime::plan_pipeline(tc, false, 3, 3).cut_bytes.size(), 5u);
  }
  // A stage without a layer, and fewer micro-batches than 1F1B needs: errors naming the keys.
  bool unet = false;
  const std::string many = error_message([&] {
    runtime::plan_pipeline(preset_config("gpt2-124m.json", {"pipeline.stages=13", "gradient_accumulation_steps=13"}, 13,
                                         unet), false, 13, 13);
  });
  EXPECT_NE(many.find("pipeline.stages"), std::string::npos) << many;
  EXPECT_NE(many.find("12 layers"), std::string::npos) << many;
  const std::string few = error_message([&] {
    runtime::plan_pipeline(preset_config("gpt2-124m.json", {"pipeline.stages=3", "gradient_accumulation_steps=2"}, 3,
                                         unet), false, 3, 3);
  });
  EXPECT_NE(few.find("gradient_accumulation_steps"), std::string::npos) << few;
}

// The UNet's stages span its blocks, the stem on the first and the head on the last; their
// parameters add up to the whole UNet's. `zeropipe plan` reports them and judges the worst stage.
TEST(RunPlan, PipelinedUNetIsPlannedPerStage) {
  bool unet = false;
  const runtime::TrainConfig tc = preset_config(
      "sdxl-unet-zero2.json", {"pipeline.stages=5", "gradient_accumulation_steps=5"}, 5, unet);
  ASSERT_TRUE(unet);
  const runtime::PipelinePlan p = runtime::plan_pipeline(tc, true, 5, 5);
  ASSERT_EQ(p.stages.size(), 5u);
  std::string source;
  const io::json hub = tc.hub_config_json(source);
  models::UNet whole(models::UNetConfig::from_hub_json(hub, source), Device::cpu(), tc.dtype, nullptr, 1, false);
  int64_t params = 0;
  double worst = 0;
  for (size_t s = 0; s < 5; ++s) {
    const runtime::StagePlan& st = p.stages[s];
    params += st.params;
    EXPECT_EQ(st.plan.states.world, 1);
    EXPECT_EQ(st.holds.find("stem") != std::string::npos, s == 0) << st.holds;
    EXPECT_EQ(st.holds.find("head") != std::string::npos, s == 4) << st.holds;
    EXPECT_GT(st.plan.activation_bytes, 0.0);
    worst = std::max(worst, st.plan.gpu_bytes());
  }
  EXPECT_EQ(params, whole.num_parameters());
  EXPECT_DOUBLE_EQ(p.stages[p.worst_stage()].plan.gpu_bytes(), worst);
  // The verdict is the worst stage's: it fits in exactly its GPU bytes, not in one byte less.
  runtime::NodeResources have;
  have.gpu_bytes = worst;
  EXPECT_TRUE(runtime::misfits(p, have).empty());
  have.gpu_bytes = worst - 1;
  const std::vector<runtime::Misfit> bad = runtime::misfits(p, have);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].tier, "GPU memory per rank (stage " + std::to_string(p.worst_stage()) + ")");
  // The fullest node: all five stages' ranks on one.
  double host = 0;
  for (const runtime::StagePlan& st : p.stages) host += st.plan.pinned_host_bytes() + st.plan.pageable_host_bytes();
  EXPECT_DOUBLE_EQ(p.host_bytes_per_node(), host);

  // A cut carries the hidden state, the skip activations pushed before it and popped after it, and the
  // time embedding: what UNetConfig::boundary_shapes lays out, in the compute dtype.
  const int64_t S = hub.value("sample_size", int64_t(64));
  const runtime::UNetChunks chunks = runtime::unet_chunks(tc, whole, S, S, 77, 0, 5);
  ASSERT_EQ(p.cut_bytes.size(), 4u);
  for (size_t g = 1; g < 5; ++g) {
    int64_t n = 0;
    for (const Shape& sh : whole.config().boundary_shapes(chunks.bounds[g], tc.micro_batch, S, S)) n += shape_numel(sh);
    EXPECT_DOUBLE_EQ(p.cut_bytes[g - 1], double(n * dtype_size(tc.dtype))) << "cut " << g;
  }
  std::string out;
  plan("sdxl-unet-zero2.json", {"pipeline.stages=5", "gradient_accumulation_steps=5"}, 5, "24GiB", "64GiB", out);
  EXPECT_NE(out.find("pipeline: 5 stages (1f1b, M = 5 micro-batches; UNet blocks [0, "), std::string::npos) << out;
  EXPECT_NE(out.find("  across cuts    "), std::string::npos) << out;
  EXPECT_NE(out.find("worst stage " + std::to_string(p.worst_stage())), std::string::npos) << out;
}

// With a lora section the plan is of what the run trains: gradients and optimizer state for the
// adapters the model builds, the base frozen (its weights only, in the compute dtype, sharded at
// stage 3 like any weights).
TEST(RunPlan, LoraPlansTheAdaptersAloneAsTrained) {
  const int world = 4;
  // The LoRA presets' lora sections on the presets of the same models (which describe them inline).
  for (const auto& [preset, lora_preset] : {std::pair<std::string, std::string>{"llama-8b.json", "llama-8b-lora.json"},
                                            {"sdxl-unet-zero3-offload.json", "sdxl-unet-lora.json"}}) {
    io::Config c = io::Config::from_file(runtime::train_schema_with_diffusion(), (kConfigs / preset).string(),
                                         io::Config::OnProblem::Keep);
    const io::json lora = io::read_json_file((kConfigs / lora_preset).string())["lora"];
    for (const auto& [key, value] : lora.items()) c.set("lora." + key + "=" + value.dump());
    c.set("zero_optimization.stage=3");
    const bool unet = c.get<std::string>("model.type") == "unet";
    const runtime::TrainConfig tc = (unet ? runtime::UNetTrainConfig::from(c).common : runtime::TrainConfig::from(c))
                                        .resolve_for_place(world, world, Device::cpu());
    ASSERT_GT(tc.lora_r, 0) << preset;
    runtime::TrainConfig full = tc;
    full.lora_r = 0;
    const runtime::RunPlan with = runtime::plan_config(tc, unet, world, world);
    const runtime::RunPlan without = runtime::plan_config(full, unet, world, world);

    // The adapters of the model as the run lays it out, found by their names.
    std::string source;
    const io::json hub = tc.hub_config_json(source);
    const int64_t pad = parallel::shard_pad_multiple(world);
    std::unique_ptr<models::UNet> u;
    std::unique_ptr<models::Transformer> t;
    std::vector<nn::ParamBlock*> blocks;
    if (unet) {
      u = std::make_unique<models::UNet>(models::UNetConfig::from_hub_json(hub, source), Device::cpu(), tc.dtype,
                                         nullptr, pad, false, runtime::lora_spec_of(tc));
      blocks = u->blocks();
    } else {
      t = std::make_unique<models::Transformer>(models::TransformerConfig::from_hub_json(hub, source), Device::cpu(),
                                                tc.dtype, nullptr, pad, false, models::LayerSpan{},
                                                runtime::lora_spec_of(tc));
      blocks = t->blocks();
    }
    int64_t adapters = 0, adapter_blocks_padded = 0, largest_adapters = 0, all = 0;
    for (nn::ParamBlock* b : blocks) {
      bool has_adapters = false;
      for (const auto& p : b->params()) {
        all += p->numel();
        if (p->name.ends_with(".lora_A.weight") || p->name.ends_with(".lora_B.weight")) {
          adapters += p->numel();
          has_adapters = true;
        }
      }
      if (has_adapters) adapter_blocks_padded += b->padded();
      if (has_adapters) largest_adapters = std::max(largest_adapters, b->padded());
    }
    EXPECT_EQ(with.trained_params, adapters) << preset;
    EXPECT_EQ(with.states.trainable_params, adapter_blocks_padded) << preset;
    EXPECT_EQ(with.states.params, without.states.params + with.states.trainable_params) << preset;
    EXPECT_EQ(without.trained_params, all - adapters) << preset << ": without LoRA everything trains";
    if (!unet)  // 32 layers x r 16 x (in + out) of q, k, v, o (4096 -> 4096, 1024, 1024, 4096), gate, up, down
      EXPECT_EQ(adapters, 32 * 16 * (8192 + 5120 + 5120 + 8192 + 3 * (4096 + 14336))) << preset;

    // Gradients and optimizer state shrink to the adapters'; the frozen base's weights stay.
    const parallel::ShardingPolicy policy = runtime::sharding_policy(tc);
    const double shard = double(with.states.trainable_params) / world;
    const double grads = policy.shards_gradients() ? (tc.step_in_backward ? 0.0 : shard) + 2.0 * double(largest_adapters)
                                                   : double(with.states.trainable_params);
    EXPECT_DOUBLE_EQ(with.states.grad_bytes, grads * 4) << preset << ": fp32 gradients of the adapters only";
    EXPECT_LT(with.states.grad_bytes, without.states.grad_bytes / 10) << preset;
    EXPECT_DOUBLE_EQ(with.states.optimizer_bytes + with.states.host_optimizer_bytes, shard * 12) << preset;
    EXPECT_DOUBLE_EQ(without.states.optimizer_bytes + without.states.host_optimizer_bytes,
                     double(without.states.trainable_params) / world * 12) << preset;
    EXPECT_GT(with.states.param_bytes + with.states.host_param_bytes,
              without.states.param_bytes + without.states.host_param_bytes - 1)
        << preset << ": the base is held as without LoRA, the adapters on top";
    EXPECT_LT(with.states.device_bytes() + with.states.host_bytes(),
              without.states.device_bytes() + without.states.host_bytes()) << preset;
    EXPECT_NE(with.model.find("LoRA r="), std::string::npos) << with.model;
    EXPECT_EQ(without.model.find("LoRA"), std::string::npos) << without.model;
  }
}

}  // namespace zp::test

namespace zp::test {

TEST(CpuShare, ListsAndShares) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list("5"), (std::vector<int>{5}));
  EXPECT_EQ(cpu_list_str({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  const std::string m = error_message([] { parse_cpu_list("0-x"); });
  EXPECT_NE(m.find("CPU list '0-x'"), std::string::npos) << m;
  EXPECT_NE(error_message([] { parse_cpu_list("4-2"); }), "");
  std::vector<int> sixteen(16);
  for (int i = 0; i < 16; ++i) sixteen[size_t(i)] = i;
  EXPECT_EQ(cpu_share(sixteen, 0, 1), sixteen);
  EXPECT_EQ(cpu_share(sixteen, 1, 5), (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(cpu_share(sixteen, 4, 5), (std::vector<int>{12, 13, 14, 15}));
  EXPECT_EQ(cpu_share({0, 1}, 4, 5), (std::vector<int>{0})) << "more ranks than CPUs: they share";
  EXPECT_FALSE(node_cpus().empty());
  EXPECT_FALSE(thread_cpus().empty());
}

}  // namespace zp::test
