// ZeRO-Offload's CPU tier and ZeRO-Infinity's NVMe tier in the training loop (issue 11), at any world
// size (mpirun -np 1, 2, 3, 5):
//  - with zero_optimization.offload_optimizer.device = "cpu" the optimizer state lives in host memory,
//    with "nvme" in a swap file per rank under nvme_path, and AdamW runs on the CPU; the trajectory
//    (losses and final fp32 parameters) equals the one with the state on the device to 1e-5, at
//    stages 1, 2 and 3, for Llama, the tied GPT-2 and the demo UNet, with and without gradient
//    accumulation;
//  - at stage 3 the same holds with the parameter shards in host memory (offload_param.device =
//    "cpu") or on NVMe ("nvme": a swap file per rank, read through two buffers so that shards come
//    from the file, not only from the buffers' cache), with the optimizer in host memory, on NVMe or
//    on the device; on a CPU device host memory is the device's, so the transfers themselves are
//    tested on GPUs (OffloadParamsGpu);
//  - a checkpoint saved with the state on any tier resumes on any other, on the same trajectory;
//  - an nvme_path (either tier's) that cannot hold the swap files stops every rank at start, naming
//    the key, the directory and the bytes;
//  - on GPUs, start-up and a resume raise the peak host RSS by the rank's host state, not the model.
// Every rank takes the same branches: no rank is ever left alone in a collective.
#include <gtest/gtest.h>
#include <mpi.h>
#include <sys/mount.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/allocator.h"
#include "core/cpu_share.h"
#include "core/device.h"
#include "models/transformer.h"
#include "parallel/sharding_policy.h"
#include "runtime/run_plan.h"
#include "test_util.h"
#include "training_runs.h"

namespace zp::test {
namespace {

// Accumulation steps that divide this world's share of the global batch.
int accumulation() { return (kGlobalBatch / world_size()) % 2 == 0 ? 2 : 3; }

// The optimizer state in host memory and on NVMe, and at stage 3 the parameters in host memory,
// against the device, for each model, stage and accumulation.
void expect_offloaded_tiers_follow_the_device_trajectory() {
  comm::Runtime rt;
  const int world = world_size();
  for (const std::string model : {"llama", "gpt2", "unet"}) {
    SharedDir dir("offload_" + model);
    const std::string data = data_file(dir, model);
    const std::string swap = dir / "swap";  // both NVMe tiers' swap files (created by the start-up check)
    for (int stage = 1; stage <= 3; ++stage)
      for (int accum : {1, accumulation()}) {
        // Accumulation once per model keeps the suite short: Llama at stage 1, GPT-2 at 2, UNet at 3.
        if (accum > 1 && stage != (model == "llama" ? 1 : model == "gpt2" ? 2 : 3)) continue;
        TrainingRun r{model, stage, world};
        r.grad_accum = accum;
        r.nvme_path = swap;
        r.param_buffer_count = 2;
        const runtime::TrainResult on_device = run(data, r, rt, MPI_COMM_WORLD, true);
        const std::string what = model + " stage " + std::to_string(stage) + " world " + std::to_string(world) +
                                 " accumulation " + std::to_string(accum);
        for (const std::string tier : {"cpu", "nvme"}) {
          r.offload = tier;
          r.offload_param = "none";
          expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), on_device, what + " optimizer on " + tier);
          // And the parameter tier: the CPU AdamW writes the new weights into the host shards, or
          // into the NVMe tier's buffers, which go to the swap file.
          if (stage == 3)
            for (const std::string param_tier : {"cpu", "nvme"}) {
              r.offload_param = param_tier;
              expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), on_device,
                                     what + " optimizer on " + tier + ", params on " + param_tier);
            }
        }
        if (stage == 3)  // the parameter tier with the optimizer on the device
          for (const std::string param_tier : {"cpu", "nvme"}) {
            r.offload = "none";
            r.offload_param = param_tier;
            expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), on_device,
                                   what + " params on " + param_tier + ", optimizer on the device");
          }
      }
  }
}

}  // namespace

// One test for every offloaded tier: the device runs they follow are the expensive part, run once.
TEST(OffloadOptimizer, CpuAndNvmeTiersFollowTheDeviceTrajectory) {
  expect_offloaded_tiers_follow_the_device_trajectory();
}

// Every tier saves, and every other tier resumes from what it saved.
TEST(OffloadOptimizer, ResumesAcrossTiers) {
  comm::Runtime rt;
  const int world = world_size();
  for (const std::string model : {"llama", "unet"}) {
    SharedDir dir("offload_resume_" + model);
    const std::string data = data_file(dir, model);
    const int stage = model == "llama" ? 2 : 3;
    runtime::TrainResult want = run(data, TrainingRun{model, stage, world}, rt, MPI_COMM_WORLD, true);
    want.losses = tail(want.losses, kSaveAt);  // the resumed runs' part
    const std::pair<std::string, std::string> pairs[] = {{"cpu", "none"},  {"none", "cpu"}, {"nvme", "none"},
                                                         {"none", "nvme"}, {"nvme", "cpu"}, {"cpu", "nvme"}};
    for (const auto& [saved_with, resumed_with] : pairs) {
      TrainingRun first{model, stage, world};
      first.offload = saved_with;
      // The UNet runs at stage 3: its parameter shards go to host memory with any offloaded optimizer.
      if (stage == 3) first.offload_param = saved_with == "none" ? "none" : "cpu";
      const std::string ckpt = dir / ("ckpt_" + saved_with + "_" + resumed_with);
      save_at_half(data, first, ckpt, rt);
      TrainingRun second{model, stage, world, kSteps, kSaveAt, ckpt};
      second.offload = resumed_with;
      if (stage == 3) second.offload_param = resumed_with == "none" ? "none" : "cpu";
      expect_resume_follows(data, second, "latest", want, model + " saved with offload " + saved_with +
                            ", resumed with " + resumed_with + ", world " + std::to_string(world), rt);
    }
  }
}

// zero_optimization.offload_optimizer.ratio 0.5: the leading blocks' state stays on the device, the
// rest on the CPU or NVMe tier, on the device trajectory (Llama at stage 1 with accumulation, GPT-2 at
// 2, the UNet at 3 with its parameter shards in host memory); a run saved with part of its state on
// the device resumes with all of it offloaded, and the reverse.
TEST(OffloadOptimizer, PartialOffloadFollowsTheDeviceTrajectory) {
  comm::Runtime rt;
  const int world = world_size();
  for (const std::string model : {"llama", "gpt2", "unet"}) {
    SharedDir dir("offload_ratio_" + model);
    const std::string data = data_file(dir, model);
    const int stage = model == "llama" ? 1 : model == "gpt2" ? 2 : 3;
    TrainingRun r{model, stage, world};
    r.grad_accum = model == "llama" ? accumulation() : 1;
    r.nvme_path = dir / "swap";
    runtime::TrainResult on_device = run(data, r, rt, MPI_COMM_WORLD, true);
    r.offload_ratio = 0.5;
    if (stage == 3) r.offload_param = "cpu";
    for (const std::string tier : {"cpu", "nvme"}) {
      r.offload = tier;
      expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), on_device,
                             model + " stage " + std::to_string(stage) + " world " + std::to_string(world) +
                                 ", half the optimizer state on " + tier);
    }
    if (model != "llama") continue;
    on_device.losses = tail(on_device.losses, kSaveAt);  // the resumed runs' part
    for (const double saved_ratio : {0.5, 1.0}) {
      TrainingRun first = r;
      first.offload = "cpu";
      first.offload_ratio = saved_ratio;
      const std::string ckpt = dir / ("ckpt_" + std::to_string(saved_ratio));
      save_at_half(data, first, ckpt, rt);
      TrainingRun second{model, stage, world, kSteps, kSaveAt, ckpt};
      second.grad_accum = r.grad_accum;
      second.offload = "cpu";
      second.offload_ratio = saved_ratio == 1.0 ? 0.5 : 1.0;
      expect_resume_follows(data, second, "latest", on_device, "llama saved with offload ratio " +
                            std::to_string(saved_ratio) + ", resumed with " + std::to_string(second.offload_ratio) +
                            ", world " + std::to_string(world), rt);
    }
  }
}

// The parameter shards on NVMe with gradient accumulation for the LMs (the UNet's runs above have it):
// the micro-steps gather every block from the buffers and the swap file, the update writes once.
TEST(OffloadParams, NvmeFollowsTheDeviceTrajectoryWithAccumulation) {
  comm::Runtime rt;
  const int world = world_size();
  for (const std::string model : {"llama", "gpt2"}) {
    SharedDir dir("offload_nvme_params_accum_" + model);
    const std::string data = data_file(dir, model);
    TrainingRun r{model, 3, world};
    r.grad_accum = accumulation();
    r.nvme_path = dir / "swap";
    r.param_buffer_count = 2;
    const runtime::TrainResult on_device = run(data, r, rt, MPI_COMM_WORLD, true);
    r.offload_param = "nvme";
    for (const std::string optimizer : {"none", "nvme"}) {
      r.offload = optimizer;
      expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), on_device,
                             model + " params on nvme, optimizer on " + optimizer + ", accumulation " +
                                 std::to_string(r.grad_accum) + ", world " + std::to_string(world));
    }
  }
}

// The parameter shards on NVMe save and resume like any tier: a run saved with them resumes with the
// shards in memory (and in host memory), and the reverse, on the straight run's trajectory; with one
// buffer every shard of the resumed run is read back from the swap file the load rewrote.
TEST(OffloadParams, ResumesAcrossNvmeParameters) {
  comm::Runtime rt;
  const int world = world_size();
  for (const std::string model : {"llama", "gpt2"}) {
    SharedDir dir("offload_resume_nvme_params_" + model);
    const std::string data = data_file(dir, model);
    runtime::TrainResult want = run(data, TrainingRun{model, 3, world}, rt, MPI_COMM_WORLD, true);
    want.losses = tail(want.losses, kSaveAt);  // the resumed runs' part
    // (saved with, resumed with): the parameter tier and the optimizer's.
    const std::pair<std::string, std::string> pairs[] = {{"nvme", "none"}, {"none", "nvme"}, {"nvme", "cpu"}};
    for (const auto& [saved_with, resumed_with] : pairs) {
      TrainingRun first{model, 3, world};
      first.offload_param = saved_with;
      first.nvme_path = dir / "swap";
      first.param_buffer_count = 1;
      if (saved_with == "nvme") first.offload = "nvme";  // both tiers in one directory
      const std::string ckpt = dir / ("ckpt_" + saved_with + "_" + resumed_with);
      save_at_half(data, first, ckpt, rt);
      TrainingRun second{model, 3, world, kSteps, kSaveAt, ckpt};
      second.offload_param = resumed_with;
      second.nvme_path = dir / "swap";
      second.param_buffer_count = 1;
      expect_resume_follows(data, second, "latest", want, model + " saved with params on " + saved_with +
                            ", resumed with " + resumed_with + ", world " + std::to_string(world), rt);
    }
  }
}

// The parameter tier's nvme_path: under a regular file it can be neither used nor created; every
// rank stops before the first step naming the key and the directory.
TEST(OffloadParams, NvmeBadPathFailsAtStartNamingTheKey) {
  comm::Runtime rt;
  SharedDir dir("offload_bad_nvme_params");
  const std::string data = data_file(dir, "llama");
  TrainingRun r{"llama", 3, world_size()};
  r.offload_param = "nvme";
  r.nvme_path = "/etc/hostname/swap";
  std::string m = error_message([&] { run(data, r, rt, MPI_COMM_WORLD); });
  EXPECT_NE(m.find("zero_optimization.offload_param.nvme_path '/etc/hostname/swap'"), std::string::npos) << m;
  EXPECT_NE(m.find("cannot be created"), std::string::npos) << m;
  // With the optimizer's tier in the same directory, one check names both keys.
  r.offload = "nvme";
  m = error_message([&] { run(data, r, rt, MPI_COMM_WORLD); });
  EXPECT_NE(m.find("zero_optimization.offload_optimizer.nvme_path and zero_optimization.offload_param.nvme_path "
                   "'/etc/hostname/swap'"), std::string::npos) << m;
}

// An nvme_path under a regular file can be neither used nor created: every rank stops before the
// first step with the same error, naming the key and the path.
TEST(OffloadOptimizer, NvmeBadPathFailsAtStartNamingTheKey) {
  comm::Runtime rt;
  SharedDir dir("offload_bad_nvme");
  const std::string data = data_file(dir, "llama");
  TrainingRun r{"llama", 2, world_size()};
  r.offload = "nvme";
  r.nvme_path = "/etc/hostname/swap";
  const std::string m = error_message([&] { run(data, r, rt, MPI_COMM_WORLD); });
  EXPECT_NE(m.find("zero_optimization.offload_optimizer.nvme_path '/etc/hostname/swap'"), std::string::npos) << m;
  EXPECT_NE(m.find("cannot be created"), std::string::npos) << m;
}

// A disk too small for this node's swap files (a 32 KiB tmpfs, where mounting is permitted) stops
// every rank at start, naming the key, the bytes free and the bytes needed.
TEST(OffloadOptimizer, NvmeDiskTooSmallFailsAtStartNamingTheBytes) {
  comm::Runtime rt;
  SharedDir dir("offload_small_nvme");
  const std::string data = data_file(dir, "llama");
  const std::string small = dir / "small";
  int mounted = 0;
  if (world_rank() == 0) {
    std::filesystem::create_directories(small);
    mounted = ::mount("none", small.c_str(), "tmpfs", 0, "size=32k") == 0;
  }
  MPI_Bcast(&mounted, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!mounted) GTEST_SKIP() << "cannot mount a small tmpfs here (needs CAP_SYS_ADMIN)";
  TrainingRun r{"llama", 2, world_size()};
  r.offload = "nvme";
  r.nvme_path = small;
  const std::string m = error_message([&] { run(data, r, rt, MPI_COMM_WORLD); });
  // The parameter tier's swap files (stage 3) in the same small directory.
  TrainingRun p{"llama", 3, world_size()};
  p.offload_param = "nvme";
  p.nvme_path = small;
  p.layers = 8;  // shards larger than 32 KiB together even at 5 ranks
  const std::string pm = error_message([&] { run(data, p, rt, MPI_COMM_WORLD); });
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) ::umount(small.c_str());
  EXPECT_NE(m.find("zero_optimization.offload_optimizer.nvme_path '" + small + "': 32768 bytes free, but"),
            std::string::npos) << m;
  EXPECT_NE(m.find("swap files of this node's " + std::to_string(world_size()) + " rank(s) need"), std::string::npos)
      << m;
  EXPECT_NE(pm.find("zero_optimization.offload_param.nvme_path '" + small + "': 32768 bytes free, but"),
            std::string::npos) << pm;
  EXPECT_NE(pm.find("bytes for the parameter shards"), std::string::npos) << pm;
}

namespace {


// The optimizer state on `tier` against the device, on GPUs: Llama at stage 1, GPT-2 at 2 with
// accumulation, the UNet at 3 (with `params_too`, also with the parameters in host memory).
void expect_optimizer_tier_follows_on_gpus(const std::string& tier, bool params_too) {
  comm::Runtime rt;
  const int world = world_size();
  for (const std::string model : {"llama", "gpt2", "unet"}) {
    SharedDir dir("offload_gpu_" + tier + "_" + model);
    const std::string data = data_file(dir, model);
    const int stage = model == "llama" ? 1 : model == "gpt2" ? 2 : 3;
    TrainingRun r{model, stage, world};
    r.device = "cuda";
    r.grad_accum = model == "gpt2" ? accumulation() : 1;
    const runtime::TrainResult on_device = run(data, r, rt, MPI_COMM_WORLD, true);
    r.offload = tier;
    const std::string what = model + " on GPUs, optimizer on " + tier + ", stage " + std::to_string(stage);
    expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), on_device, what);
    if (params_too && stage == 3) {  // the new weights go straight into the pinned host shards
      r.offload_param = "cpu";
      expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), on_device, what + ", parameters in host memory");
    }
  }
}

}  // namespace

// On GPUs: the device store runs the CUDA AdamW (fused multiply-adds) and the host store the CPU one,
// and the embedding's backward adds rows with fp32 atomics, so the trajectories agree to 1e-5 rather
// than bit for bit. The host store walks its staging ring here (pinned memory, a copy stream).
TEST(OffloadOptimizerGpu, CpuTierFollowsTheDeviceTrajectoryOnGpus) {
  if (!every_rank_has_a_gpu()) GTEST_SKIP() << "needs one GPU per rank";
  expect_optimizer_tier_follows_on_gpus("cpu", false);
}

// The same with the state on NVMe: the gradients come down and the weights go up through the staging
// ring (pinned buffers), the state through the swap file (O_DIRECT from pinned memory where the
// temporary directory's file system takes it); at stage 3 also with the parameter tier.
TEST(OffloadOptimizerGpu, NvmeTierFollowsTheDeviceTrajectoryOnGpus) {
  if (!every_rank_has_a_gpu()) GTEST_SKIP() << "needs one GPU per rank";
  expect_optimizer_tier_follows_on_gpus("nvme", true);
}

// offload_optimizer.ratio 0.5 on GPUs: the device part's CUDA AdamW runs on the stream while the CPU
// updates the rest through the staging ring (or the swap file).
TEST(OffloadOptimizerGpu, PartialOffloadFollowsTheDeviceTrajectoryOnGpus) {
  if (!every_rank_has_a_gpu()) GTEST_SKIP() << "needs one GPU per rank";
  comm::Runtime rt;
  const int world = world_size();
  for (const std::string model : {"llama", "unet"}) {
    SharedDir dir("offload_ratio_gpu_" + model);
    const std::string data = data_file(dir, model);
    const int stage = model == "llama" ? 2 : 3;
    TrainingRun r{model, stage, world};
    r.device = "cuda";
    r.grad_accum = model == "llama" ? accumulation() : 1;
    const runtime::TrainResult on_device = run(data, r, rt, MPI_COMM_WORLD, true);
    r.offload_ratio = 0.5;
    for (const std::string tier : {"cpu", "nvme"}) {
      r.offload = tier;
      r.offload_param = stage == 3 && tier == "cpu" ? "cpu" : "none";
      expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), on_device,
                             model + " on GPUs, half the optimizer state on " + tier);
    }
  }
}

// The parameter tier on GPUs: each rank's shards of the compute weights live in pinned host memory
// (or on NVMe, through two pinned buffers); every gather copies the shard up and all-gathers in
// place (on a single rank, prefetched on the upload stream). With the optimizer in host memory the
// CPU writes the new weights straight into the shards (or buffers); with the optimizer on the device
// its kernel writes them through the pinned mapping.
TEST(OffloadParamsGpu, HostShardsFollowTheDeviceTrajectoryOnGpus) {
  if (!every_rank_has_a_gpu()) GTEST_SKIP() << "needs one GPU per rank";
  comm::Runtime rt;
  const int world = world_size();
  for (const std::string model : {"llama", "gpt2", "unet"}) {
    SharedDir dir("offload_params_gpu_" + model);
    const std::string data = data_file(dir, model);
    TrainingRun r{model, 3, world};
    r.device = "cuda";
    r.grad_accum = model == "gpt2" ? accumulation() : 1;
    const runtime::TrainResult on_device = run(data, r, rt, MPI_COMM_WORLD, true);
    r.nvme_path = dir / "swap";
    r.param_buffer_count = 2;
    for (const std::string param_tier : {"cpu", "nvme"}) {
      r.offload_param = param_tier;
      r.offload = "cpu";
      expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), on_device,
                             model + " params on " + param_tier + ", optimizer on the host");
      r.offload = "none";
      expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), on_device,
                             model + " params on " + param_tier + ", optimizer on the device");
    }
  }
}

}  // namespace zp::test

namespace zp::test {

// The start-up fit check: a plan whose exact part does not fit on one rank stops every rank with
// one message naming that rank, the tier and the bytes; a plan that fits gives rank 0 its line.
TEST(OffloadPlan, ARunThatCannotFitStopsEveryRankNamingTheTier) {
  const int last = world_size() - 1;
  runtime::RunPlan p;
  p.gpu = false;
  p.states.param_bytes = 1e6;
  EXPECT_NE(runtime::check_fit_at_start(p, Device::cpu(), MPI_COMM_WORLD).find("fit check"), std::string::npos);
  if (world_rank() == last) p.states.host_optimizer_bytes = 1e18;  // an exabyte of optimizer state
  const std::string m = error_message([&] { runtime::check_fit_at_start(p, Device::cpu(), MPI_COMM_WORLD); });
  EXPECT_NE(m.find("does not fit on rank " + std::to_string(last)), std::string::npos) << m;
  EXPECT_NE(m.find("host memory per node"), std::string::npos) << m;
  EXPECT_NE(m.find("available (MemAvailable"), std::string::npos) << m;
  EXPECT_NE(m.find("zeropipe plan"), std::string::npos) << m;
}

}  // namespace zp::test

namespace zp::test {

// Under mpirun each rank starts bound to one core (Open MPI's default); taking the rank's share of
// the node gives its host work at least that share, or says why it cannot.
TEST(OffloadCpuShare, EachRankTakesItsShareOfTheNode) {
  comm::Runtime rt;
  const CpuShare share = take_cpu_share(rt.local_rank(), rt.local_size());
  const size_t want = cpu_share(node_cpus(), rt.local_rank(), rt.local_size()).size();
  if (share.refused) {
    EXPECT_NE(share.note.find("--bind-to none"), std::string::npos) << share.note;
    GTEST_SKIP() << share.note;
  }
  EXPECT_GE(share.cpus.size(), want);
  EXPECT_EQ(thread_cpus(), share.cpus) << "the calling thread runs on the share now";
}

}  // namespace zp::test

namespace zp::test {

namespace {

// Resets this process's peak RSS (VmHWM) to its current RSS; false where the kernel refuses.
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return bool(f);
}

}  // namespace

// Item 6, "start-up stays shard-sized": a Llama of 0.6B parameters on GPUs, ZeRO-3 with the optimizer
// and the parameters in host memory. Its start-up (every block allocated and initialised, one at a
// time) and one step, then a resume from the checkpoint that run saved, each raise the rank's peak
// host RSS by at most the host state the plan says it keeps (12 bytes of optimizer state and 2 of
// weights per owned parameter) plus three fp32 blocks and 768 MiB of buffers and runtime; a
// whole-model fp32 copy anywhere (2.5 GB) would not fit in that margin.
TEST(OffloadStartupGpu, HostPeakStaysShardSized) {
  if (!every_rank_has_a_gpu()) GTEST_SKIP() << "needs one GPU per rank";
  comm::Runtime rt;
  const int world = world_size();
  SharedDir dir("offload_startup_rss");
  const std::string data = data_file(dir, "llama");
  TrainingRun r{"llama", 3, world, 1, 1, dir / "ckpt"};
  r.device = "cuda";
  r.offload = "cpu";
  r.offload_param = "cpu";
  r.bf16 = true;
  io::Config c = user_config(data, r);
  c.set("model.config.hidden_size=2048");
  c.set("model.config.intermediate_size=5632");
  c.set("model.config.num_hidden_layers=12");
  c.set("model.config.num_attention_heads=16");
  c.set("model.config.num_key_value_heads=16");
  runtime::TrainConfig t = runtime::TrainConfig::from(c);

  const auto mcfg = models::TransformerConfig::from_hub_json(c.at("model.config"), "rss-test");
  models::Transformer laid_out(mcfg, Device::cpu(), DType::BF16, nullptr, parallel::shard_pad_multiple(world),
                               /*allocate=*/false);
  int64_t params = 0, largest = 0;
  for (const nn::ParamBlock* b : laid_out.blocks()) {
    params += b->padded();
    largest = std::max(largest, b->padded());
  }
  const double state = 14.0 * double(params) / world, margin = 3.0 * 4.0 * double(largest) + double(768ull << 20);
  ASSERT_GT(4.0 * double(params), margin) << "the model is too small for a whole-model copy to show";

  for (const std::string resume : {"", "latest"}) {
    t.resume = resume;
    t.max_steps = resume.empty() ? 1 : 2;
    const double rss = host_current_rss_bytes();
    ASSERT_TRUE(reset_peak_rss()) << "/proc/self/clear_refs refused a reset of the peak RSS";
    const runtime::TrainResult res = runtime::train(t, rt, MPI_COMM_WORLD, false);
    const double rise = host_peak_rss_bytes() - rss;
    EXPECT_EQ(res.resumed_from.empty(), resume.empty());
    EXPECT_LE(rise, state + margin) << (resume.empty() ? "start-up and one step" : "resume and one step")
                                    << ": the peak host RSS rose by " << rise / 1e9 << " GB; the host state is "
                                    << state / 1e9 << " GB, the margin " << margin / 1e9 << " GB";
    if (world_rank() == 0)
      std::printf("[ MEASURED ] %s: peak host RSS +%.2f GB (host state %.2f GB, bound %.2f GB)\n",
                  resume.empty() ? "start-up + 1 step" : "resume + 1 step", rise / 1e9, state / 1e9,
                  (state + margin) / 1e9);
  }
}

}  // namespace zp::test
