// LoRA in the training loop (issue 14), at any world size (mpirun -np 1, 2, 3, 5):
//  - the adapters' trajectory (losses and final adapter weights) at ZeRO stages 0-3, with the
//    optimizer in host memory and at stage 3 the frozen base's shards in host memory too (and both
//    on the NVMe tier), with
//    accumulation and activation checkpointing, follows one rank at stage 0 to 1e-5, for Llama,
//    GPT-2 and the demo UNet, with dropout (its masks follow a sample's global position, not the rank
//    or micro-step that runs it: nn/context.h);
//  - the base takes no update: a run's final weights are exactly the adapters;
//  - a checkpoint holds the adapters and their moments only, resumes bit for bit, and refuses a run on
//    another base (naming both), a run with other LoRA settings and a full-training run;
//  - lora.init_from starts a run's adapters from a LoRA checkpoint or a PEFT folder, exactly, and
//    refuses an adapter whose rank, scale or modules differ from the run's;
//  - the UNet's convolution adapters (conv_in and conv_out too), with dropout, follow one rank at ZeRO 2
//    and 3, and their PEFT, diffusers and kohya-ss exports start a run exactly where the saved one ended.
// Every rank takes the same branches: no rank is ever left alone in a collective.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>

#include "io/checkpoint_file.h"
#include "io/h5file.h"
#include "io/lora_adapter_files.h"
#include "io/safetensors.h"
#include "training_runs.h"

namespace zp::test {
namespace {

// GPT-2's fused c_attn and its MLP's c_proj (not attn.c_proj); Llama's q, v (two of the packed
// three) and down projections.
io::json lora_for(const std::string& model, double dropout) {
  const io::json targets = model == "gpt2"   ? io::json{"c_attn", "mlp.c_proj"}
                           : model == "unet" ? io::json{"to_q", "to_v", "to_out.0", "ff.net.2"}
                                             : io::json{"q_proj", "v_proj", "down_proj"};
  return {{"r", 4}, {"alpha", 8}, {"dropout", dropout}, {"target_modules", targets}};
}

// Adapter weights: A [4, in] and B [out, 4] for every targeted module of both layers.
size_t adapter_count(const std::string& model) {
  if (model == "gpt2") return 2 * (4 * 32 + 96 * 4 + 4 * 128 + 32 * 4);
  return 2 * (4 * 32 + 32 * 4 + 4 * 32 + 16 * 4 + 4 * 48 + 32 * 4);
}

}  // namespace

TEST(Lora, StagesAndTiersFollowOneRank) {
  comm::Runtime rt;
  const int world = world_size(), rank = world_rank();
  for (const std::string model : {"llama", "gpt2", "unet"}) {
    SharedDir dir("lora_" + model);
    const std::string data = data_file(dir, model);
    const double dropout = 0.1;
    TrainingRun one{model, 0, 1};
    one.lora = lora_for(model, dropout);
    runtime::TrainResult ref;
    if (rank == 0) ref = run(data, one, rt, MPI_COMM_SELF, true);
    int n = int(ref.final_params.size());
    MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
    ref.losses.resize(kSteps);
    ref.final_params.resize(size_t(n));
    MPI_Bcast(ref.losses.data(), kSteps, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Bcast(ref.final_params.data(), n, MPI_FLOAT, 0, MPI_COMM_WORLD);
    if (model != "unet")
      EXPECT_EQ(size_t(n), adapter_count(model)) << model << ": the final weights are the adapters, nothing else";

    for (int stage = 0; stage <= 3; ++stage) {
      TrainingRun r{model, stage, world};
      r.lora = lora_for(model, dropout);
      r.grad_accum = stage == 1 ? ((kGlobalBatch / world) % 2 == 0 ? 2 : 3) : 1;
      r.activation_checkpointing = stage == 2;
      const std::string what = model + " LoRA stage " + std::to_string(stage) + " world " + std::to_string(world);
      expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), ref, what);
      if (stage >= 1) {
        r.offload = "cpu";
        if (stage == 3) r.offload_param = "cpu";
        expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), ref, what + " offloaded");
      }
      if (stage == 3) {  // the NVMe tier: the adapters' optimizer state and the frozen base's shards in swap files
        r.offload = r.offload_param = "nvme";
        expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), ref, what + " on NVMe");
      }
    }
  }
}

// On GPUs (one per rank): the adapters' trajectory at stage 3 with the frozen base's shards in pinned
// host memory (gathered up for every forward and backward) and the optimizer on the CPU follows
// stage 0 on the device, for both families.
TEST(LoraGpu, OffloadedBaseFollowsStage0OnGpus) {
  if (!every_rank_has_a_gpu()) GTEST_SKIP() << "needs one GPU per rank";
  comm::Runtime rt;
  const int world = world_size();
  for (const std::string model : {"llama", "gpt2"}) {
    SharedDir dir("lora_gpu_" + model);
    const std::string data = data_file(dir, model);
    TrainingRun r{model, 0, world};
    r.device = "cuda";
    r.lora = lora_for(model, 0.1);
    const runtime::TrainResult ref = run(data, r, rt, MPI_COMM_WORLD, true);
    r.stage = 3;
    r.offload = "cpu";
    r.offload_param = "cpu";
    r.activation_checkpointing = true;
    expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), ref, model + " LoRA, base offloaded, on GPUs");
  }
}

TEST(Lora, CheckpointsHoldTheAdaptersAndGuardTheBase) {
  comm::Runtime rt;
  const int world = world_size();
  SharedDir dir("lora_ckpt");
  const std::string data = data_file(dir, "llama");
  const std::string ckpt = dir / "ckpt";
  auto with = [&](int64_t steps, int64_t save_every, const std::string& resume) {
    TrainingRun r{"llama", 2, world, steps, save_every, save_every || !resume.empty() ? ckpt : "", resume};
    r.lora = lora_for("llama", 0.1);
    return r;
  };
  const runtime::TrainResult straight = run(data, with(kSteps, 0, ""), rt, MPI_COMM_WORLD, true);
  const runtime::TrainResult first = run(data, with(kSaveAt, kSaveAt, ""), rt, MPI_COMM_WORLD);
  ASSERT_EQ(first.saved.size(), 1u);
  const runtime::TrainResult second = run(data, with(kSteps, 0, "latest"), rt, MPI_COMM_WORLD, true);
  EXPECT_EQ(second.losses, tail(straight.losses, kSaveAt)) << "losses after the resume, bit for bit";
  ASSERT_EQ(second.final_params.size(), straight.final_params.size());
  EXPECT_EQ(std::memcmp(second.final_params.data(), straight.final_params.data(),
                        straight.final_params.size() * sizeof(float)), 0) << "final adapters, bit for bit";

  // The file: adapters under /model, LoRA settings and the base's identity at the root.
  if (world_rank() == 0) {
    io::H5File f = io::H5File::open(first.saved[0]);
    size_t adapters = 0;
    for (const std::string& c : f.children("/model")) {
      EXPECT_TRUE(c.ends_with(".lora_A.weight") || c.ends_with(".lora_B.weight")) << c;
      ++adapters;
    }
    EXPECT_EQ(adapters, 2u * 2u * 3u);  // 2 layers x 3 modules x (A, B)
    EXPECT_EQ(io::json::parse(f.attr_string("/", "lora"))["r"], 4);
    EXPECT_FALSE(f.attr_string("/", "base_fingerprint").empty());
    EXPECT_NE(f.attr_string("/", "base_model").find("random"), std::string::npos);
  }

  // Another base (other initial weights): refused, naming both fingerprints.
  TrainingRun other = with(kSteps, 0, first.saved[0]);
  other.init_std = 0.03;
  try {
    run(data, other, rt, MPI_COMM_WORLD);
    ADD_FAILURE() << "a resume on another base was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another base model"), std::string::npos) << e.what();
  }
  // Other LoRA settings, and a full-training run: refused.
  TrainingRun rank8 = with(kSteps, 0, first.saved[0]);
  rank8.lora["r"] = 8;
  try {
    run(data, rank8, rt, MPI_COMM_WORLD);
    ADD_FAILURE() << "a resume with another rank was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LoRA settings differ"), std::string::npos) << e.what();
  }
  TrainingRun full = with(kSteps, 0, first.saved[0]);
  full.lora = nullptr;
  try {
    run(data, full, rt, MPI_COMM_WORLD);
    ADD_FAILURE() << "a full-training resume of a LoRA checkpoint was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a LoRA checkpoint"), std::string::npos) << e.what();
  }
}

TEST(Lora, InitFromAnAdapterStartsThere) {
  comm::Runtime rt;
  const int world = world_size();
  SharedDir dir("lora_init");
  const std::string data = data_file(dir, "llama");
  TrainingRun trained{"llama", 2, world, kSaveAt, kSaveAt, dir / "ckpt", ""};
  trained.lora = lora_for("llama", 0.0);
  const runtime::TrainResult first = run(data, trained, rt, MPI_COMM_WORLD, true);
  ASSERT_EQ(first.saved.size(), 1u);
  const std::string peft = dir / "peft";
  if (world_rank() == 0) io::write_peft_adapter(peft, io::read_lora_checkpoint(first.saved[0]));
  MPI_Barrier(MPI_COMM_WORLD);

  // One step at lr 1e-30 (far below any weight's ulp; the warmup's first update is at lr 0 anyway)
  // keeps the initial adapters: they must be the trained ones, bit for bit, from the checkpoint and
  // from the PEFT folder (written in fp32), at another ZeRO stage.
  auto from = [&](const std::string& adapter) {
    TrainingRun r{"llama", 3, world, 1, 0, "", ""};
    r.lora = lora_for("llama", 0.0);
    r.lora["init_from"] = adapter;
    r.lr = 1e-30;
    return r;
  };
  for (const std::string& adapter : {first.saved[0], peft}) {
    const runtime::TrainResult started = run(data, from(adapter), rt, MPI_COMM_WORLD, true);
    ASSERT_EQ(started.final_params.size(), first.final_params.size()) << adapter;
    EXPECT_EQ(std::memcmp(started.final_params.data(), first.final_params.data(),
                          first.final_params.size() * sizeof(float)), 0) << adapter << ": initial adapters";
  }
  // Without init_from the same run starts from PEFT's initialisation (B = 0), not the trained values.
  TrainingRun fresh = from("");
  fresh.lora.erase("init_from");
  EXPECT_NE(run(data, fresh, rt, MPI_COMM_WORLD, true).final_params, first.final_params);

  auto refused = [&](const TrainingRun& r, const std::string& want) {
    expect_error([&] { run(data, r, rt, MPI_COMM_WORLD); }, {want});
  };
  TrainingRun rank8 = from(peft);
  rank8.lora["r"] = 8;
  refused(rank8, "has rank 4, the run's lora.r is 8");
  TrainingRun alpha = from(peft);
  alpha.lora["alpha"] = 16;
  refused(alpha, "set lora.alpha to the adapter's");
  TrainingRun fewer = from(peft);
  fewer.lora["target_modules"] = {"q_proj", "v_proj"};
  refused(fewer, "adapts module 'model.layers.0.mlp.down_proj', which lora.target_modules");
  TrainingRun more = from(peft);
  more.lora["target_modules"] = {"q_proj", "v_proj", "down_proj", "up_proj"};
  refused(more, "has no tensor 'model.layers.0.mlp.up_proj.lora_A.weight'");
}

// Convolution adapters (PEFT's LoRA Conv2d on the ResBlocks' 3x3 conv1 / conv2, the 1x1 shortcuts
// and projections, the strided downsampler, the stem's conv_in and the head's conv_out) at ZeRO 2 and
// 3 follow one rank at stage 0, and the adapter a run saves, exported in PEFT's, diffusers' and
// kohya-ss's layouts (4-d tensors), starts another run exactly where it ended.
TEST(Lora, ConvolutionAdaptersFollowOneRankAndTheirExportsLoadBack) {
  comm::Runtime rt;
  const int world = world_size();
  SharedDir dir("lora_conv");
  const std::string data = data_file(dir, "unet");
  const io::json lora = {{"r", 4}, {"alpha", 8}, {"dropout", 0.1},
                         {"target_modules", {"conv1", "conv2", "conv_shortcut", "proj_in", "proj_out",
                                             "downsamplers.0.conv", "to_q", "conv_in", "conv_out"}}};
  TrainingRun one{"unet", 0, 1};
  one.lora = lora;
  const runtime::TrainResult ref = single_rank_reference(data, one, rt);
  for (int stage : {2, 3}) {
    TrainingRun r{"unet", stage, world};
    r.lora = lora;
    r.activation_checkpointing = stage == 3;
    expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), ref,
                           "UNet conv LoRA stage " + std::to_string(stage) + " world " + std::to_string(world));
  }

  TrainingRun trained{"unet", 3, world, kSaveAt, kSaveAt, dir / "ckpt", ""};
  trained.lora = lora;
  const runtime::TrainResult first = run(data, trained, rt, MPI_COMM_WORLD, true);
  ASSERT_EQ(first.saved.size(), 1u);
  const std::string peft = dir / "peft", diffusers = dir / "diffusers", kohya = dir / "kohya.safetensors";
  if (world_rank() == 0) {
    const io::LoraAdapter a = io::read_lora_checkpoint(first.saved[0]);
    EXPECT_EQ(a.a("down_blocks.0.resnets.0.conv1").shape(), (Shape{4, 16, 3, 3}));
    EXPECT_EQ(a.b("down_blocks.0.resnets.0.conv1").shape(), (Shape{16, 4, 1, 1}));
    EXPECT_EQ(a.a("down_blocks.0.downsamplers.0.conv").shape(), (Shape{4, 16, 3, 3}));
    EXPECT_EQ(a.a("down_blocks.0.attentions.0.proj_in").shape(), (Shape{4, 16, 1, 1}));
    EXPECT_EQ(a.b("down_blocks.1.resnets.0.conv_shortcut").shape(), (Shape{32, 4, 1, 1}));
    EXPECT_EQ(a.a("conv_in").shape(), (Shape{4, 4, 3, 3}));  // from the 4 latent channels
    EXPECT_EQ(a.b("conv_in").shape(), (Shape{16, 4, 1, 1}));
    EXPECT_EQ(a.a("conv_out").shape(), (Shape{4, 16, 3, 3}));
    EXPECT_EQ(a.b("conv_out").shape(), (Shape{4, 4, 1, 1}));  // to the 4 latent channels
    io::write_peft_adapter(peft, a);
    io::write_diffusers_lora(diffusers, a);
    // kohya-ss's names: lora_unet_conv_in.lora_down.weight, ..., and each module's alpha.
    std::vector<std::pair<std::string, Tensor>> t;
    for (const std::string& m : a.modules()) {
      std::string k = "lora_unet_" + m;
      std::replace(k.begin(), k.end(), '.', '_');
      t.emplace_back(k + ".lora_down.weight", a.a(m));
      t.emplace_back(k + ".lora_up.weight", a.b(m));
      Tensor alpha = Tensor::empty({}, DType::F32, Device::cpu());
      alpha.data<float>()[0] = float(a.config.alpha);
      t.emplace_back(k + ".alpha", alpha);
    }
    io::write_safetensors(kohya, t);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // One step at lr 1e-30 keeps the initial adapters (as in InitFromAnAdapterStartsThere).
  for (const std::string& adapter : {peft, diffusers, kohya}) {
    TrainingRun r{"unet", 2, world, 1, 0, "", ""};
    r.lora = lora;
    r.lora["init_from"] = adapter;
    r.lr = 1e-30;
    const runtime::TrainResult started = run(data, r, rt, MPI_COMM_WORLD, true);
    ASSERT_EQ(started.final_params.size(), first.final_params.size()) << adapter;
    EXPECT_EQ(std::memcmp(started.final_params.data(), first.final_params.data(),
                          first.final_params.size() * sizeof(float)), 0) << adapter << ": initial adapters";
  }
}

}  // namespace zp::test
