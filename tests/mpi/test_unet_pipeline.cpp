// Pipeline parallelism (issue 12) for the diffusion UNet on the CPU backend: the demo tiny UNet
// (5 units: two down blocks, the mid block, two up blocks) cut into P stages follows the single-rank
// trajectory within 1e-5 (fp32) with ZeRO 1-3 inside each stage, 1F1B, ZB-H1 and interleaved (where
// the units allow: P x 2 <= 5), activation checkpointing with 1F1B and ZB-H1, uneven partitions and
// two data-parallel pipelines (P2 x D2), LoRA adapters (also under ZB-H1, where they keep their
// gradients in B); a pipelined checkpoint resumes data-parallel and
// the reverse; more chunks than units, or a list that names no unit, are errors naming the keys;
// `zeropipe plan`'s plan of each stage is what its trainer builds. On GPUs, one stage per GPU over
// NCCL follows one GPU.
#include "io/checkpoint_file.h"
#include "stage_plan_check.h"
#include "training_runs.h"

namespace zp::test {
namespace {

constexpr int kUNetUnits = 5;

// The single-rank run every layout with `accum` micro-batches must follow (run on world rank 0,
// broadcast to the others).
runtime::TrainResult unet_reference(const std::string& data, int accum, comm::Runtime& rt,
                                    const io::json& lora = io::json(), const std::string& device = "cpu") {
  TrainingRun r{"unet", 0, 1};
  r.grad_accum = accum;
  r.lora = lora;
  r.device = device;
  return single_rank_reference(data, r, rt);
}

// All the ranks as P stages of one pipeline, M = P micro-batches.
TrainingRun unet_stages_of_world(int zero) {
  TrainingRun r{"unet", zero, world_size()};
  r.stages = world_size();
  r.grad_accum = world_size();
  return r;
}

}  // namespace

// P = the world (2, 3 or 5) stages, ZeRO 1, 2 and 3 inside, 1F1B, ZB-H1 and (P2: 4 chunks)
// interleaved V2; ZeRO 2 once more with activation checkpointing (1F1B, and ZB-H1, whose W passes
// then hold the re-run activations).
TEST(UNetPipeline, StagesFollowTheSingleRankTrajectory) {
  comm::Runtime rt;
  const int P = world_size();
  SharedDir dir("unet_pipeline");
  const std::string data = data_file(dir, "unet");
  const runtime::TrainResult want = unet_reference(data, P, rt);
  for (int zero : {1, 2, 3})
    for (const std::string schedule : {"1f1b", "zb-h1", "interleaved"}) {
      if (schedule == "interleaved" && 2 * P > kUNetUnits) continue;
      TrainingRun r = unet_stages_of_world(zero);
      r.schedule = schedule;
      r.virtual_stages = schedule == "interleaved" ? 2 : 1;
      const std::string what = "unet P" + std::to_string(P) + " ZeRO " + std::to_string(zero) + " " + schedule;
      expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), want, what);
      if (zero == 2 && schedule != "interleaved") {
        r.activation_checkpointing = true;
        expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), want, what + ", activation checkpointing");
      }
    }
}

// LoRA adapters on the attention blocks (down block 0, the mid block, up block 1; none on the plain
// blocks between) trained in P stages at ZeRO 2 and 3 (and ZB-H1 at ZeRO 2) follow one rank, so do
// adapters on convolutions (on every stage, conv_in and conv_out included), and their checkpoint
// resumes data-parallel.
TEST(UNetPipeline, LoraAdaptersFollowTheSingleRankTrajectory) {
  comm::Runtime rt;
  const int P = world_size();
  SharedDir dir("unet_pipeline_lora");
  const std::string data = data_file(dir, "unet");
  const io::json lora = {{"r", 4}, {"alpha", 8}, {"dropout", 0.0}, {"target_modules", {"to_q", "to_v", "ff.net.2"}}};
  const runtime::TrainResult want = unet_reference(data, P, rt, lora);
  for (int zero : {2, 3}) {
    TrainingRun r = unet_stages_of_world(zero);
    r.lora = lora;
    expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), want,
                           "unet LoRA P" + std::to_string(P) + " ZeRO " + std::to_string(zero));
  }
  // ZB-H1: the adapters' gradients stay in B (W has nothing to do), and the run still follows.
  TrainingRun zb = unet_stages_of_world(2);
  zb.lora = lora;
  zb.schedule = "zb-h1";
  expect_same_trajectory(run(data, zb, rt, MPI_COMM_WORLD, true), want,
                         "unet LoRA in " + std::to_string(P) + " zb-h1 stages, ZeRO 2");
  // Convolution adapters give every stage adapters, the plain blocks' ResBlocks and samplers too, and
  // the first and last stages the stem's conv_in and the head's conv_out adapters.
  const io::json conv_lora = {
      {"r", 4},
      {"alpha", 8},
      {"dropout", 0.0},
      {"target_modules", {"to_q", "conv2", "conv_shortcut", "downsamplers.0.conv", "conv_in", "conv_out"}}};
  TrainingRun conv = unet_stages_of_world(3);
  conv.lora = conv_lora;
  expect_same_trajectory(run(data, conv, rt, MPI_COMM_WORLD, true), unet_reference(data, P, rt, conv_lora),
                         "unet convolution LoRA P" + std::to_string(P) + " ZeRO 3");
  // The checkpoint's base fingerprint is the whole base's (every stage's part combined): a
  // data-parallel run on the same base resumes it.
  TrainingRun staged = unet_stages_of_world(2);
  staged.lora = lora;
  staged.dir = dir / "ckpt";
  staged.max_steps = kSaveAt;
  staged.save_every = kSaveAt;
  run(data, staged, rt, MPI_COMM_WORLD);
  TrainingRun flat{"unet", 1, P};
  flat.lora = lora;
  flat.resume = staged.dir + "/" + io::checkpoint_filename(kSaveAt);
  runtime::TrainResult tail_want = want;
  tail_want.losses = tail(want.losses, kSaveAt);
  const runtime::TrainResult got = run(data, flat, rt, MPI_COMM_WORLD, true);
  EXPECT_EQ(got.first_step, kSaveAt);
  expect_same_trajectory(got, tail_want, "unet LoRA saved by P" + std::to_string(P) + ", resumed data-parallel",
                         kSaveAt);
}

// Two pipelines of two stages (P2 x D2) on the first four ranks (or one pipeline at np 2), three
// micro-batches, 1F1B and ZB-H1: an explicit uneven cut (down block 0 | the rest), and the "compute"
// and "uniform" partitions; the optimizer offloaded to the CPU inside each stage.
TEST(UNetPipeline, DataParallelPipelinesUnevenCutsAndOffload) {
  comm::Runtime rt;
  if (world_size() < 4 && world_size() != 2) GTEST_SKIP() << "needs 2 or at least 4 ranks";
  const int world = world_size() >= 4 ? 4 : 2;
  SharedDir dir("unet_pipeline_dp");
  const std::string data = data_file(dir, "unet");
  const runtime::TrainResult want = unet_reference(data, 3, rt);
  MPI_Comm group = first_ranks(world);
  if (group == MPI_COMM_NULL) return;
  for (int zero : {1, 2, 3})
    for (const std::string schedule : {"1f1b", "zb-h1"}) {
      TrainingRun r{"unet", zero, world};
      r.stages = 2;
      r.grad_accum = 3;
      r.schedule = schedule;
      r.partition = zero == 1 ? io::json::array({1}) : io::json(zero == 2 ? "compute" : "uniform");
      const std::string what = "unet P2 x D" + std::to_string(world / 2) + " ZeRO " + std::to_string(zero) + " " +
                               schedule + " partition " + r.partition.dump();
      expect_same_trajectory(run(data, r, rt, group, true), want, what);
      if (zero == 2 && schedule == "1f1b") {
        r.offload = "cpu";
        expect_same_trajectory(run(data, r, rt, group, true), want, what + ", optimizer offloaded to the CPU");
      }
    }
  MPI_Comm_free(&group);
}

// Saved by P stages at step 3, resumed data-parallel at ZeRO 3 and by one rank; saved data-parallel
// at ZeRO 1, resumed by P stages (interleaved at P2). Steps 4-6 follow the single-rank run to 1e-5.
TEST(UNetPipeline, CheckpointsReshardBetweenLayouts) {
  comm::Runtime rt;
  const int P = world_size();
  SharedDir dir("unet_pipeline_reshard");
  const std::string data = data_file(dir, "unet");
  runtime::TrainResult want = unet_reference(data, P, rt);
  want.losses = tail(want.losses, kSaveAt);
  const std::string ckpt = dir / "ckpt";
  auto saved_by = [&](const TrainingRun& r, const std::string& sub) {
    return save_at_half(data, r, ckpt + "_" + sub, rt);
  };
  auto resumes = [&](const TrainingRun& r, const std::string& file, const std::string& what) {
    expect_resume_follows(data, r, file, want, "unet: " + what, rt);
  };
  TrainingRun flat{"unet", 3, P};  // all ranks data-parallel, one micro-batch each: the same global batch
  TrainingRun one{"unet", 0, 1};
  one.grad_accum = P;

  const std::string from_stages = saved_by(unet_stages_of_world(2), "stages");
  resumes(flat, from_stages, "saved by " + std::to_string(P) + " stages, resumed data-parallel at ZeRO 3");
  resumes(one, from_stages, "saved by " + std::to_string(P) + " stages, resumed by one rank");

  flat.stage = 1;
  const std::string from_flat = saved_by(flat, "flat");
  TrainingRun staged = unet_stages_of_world(3);
  if (2 * P <= kUNetUnits) {
    staged.schedule = "interleaved";
    staged.virtual_stages = 2;
  }
  resumes(staged, from_flat,
          "saved data-parallel at ZeRO 1, resumed by " + std::to_string(P) + " stages " + staged.schedule);
}

// The UNet's counterpart of Pipeline.ThePlanOfAStageIsWhatTheTrainerBuilds: for this rank's stage,
// the planner's parameters, model states and in-flight activations (the skips a cut carries
// included) are those of the trainer's start-up check, for each schedule and partition with every
// rank a stage, and (4 ranks or more) as P2 x D2 with ZeRO-3 sharding within each stage.
TEST(UNetPipeline, ThePlanOfAStageIsWhatTheTrainerBuilds) {
  comm::Runtime rt;
  SharedDir dir("unet_pipeline_plan");
  const std::string data = data_file(dir, "unet");
  const int P = world_size();
  const std::string rank = " rank " + std::to_string(world_rank());
  for (const std::string schedule : {"1f1b", "zb-h1", "interleaved"})
    for (const io::json partition : {io::json("parameters"), io::json("compute"), io::json("uniform")}) {
      if (schedule == "interleaved" && 2 * P > kUNetUnits) continue;
      TrainingRun r = unet_stages_of_world(2);
      r.schedule = schedule;
      r.virtual_stages = schedule == "interleaved" ? 2 : 1;
      r.partition = partition;
      expect_stage_plan_is_the_trainers(data, r, rt, MPI_COMM_WORLD,
                                        "unet " + schedule + " " + partition.dump() + " P" + std::to_string(P) + rank);
    }
  expect_p2_x_d2_stage_plans_are_the_trainers(data, "unet", 0, {"1f1b", "zb-h1"}, rt);
}

TEST(UNetPipeline, BadCutsAreErrorsNamingTheKeys) {
  comm::Runtime rt;
  const int P = world_size();
  SharedDir dir("unet_pipeline_bad");
  const std::string data = data_file(dir, "unet");
  TrainingRun r = unet_stages_of_world(1);
  r.schedule = "interleaved";
  r.virtual_stages = kUNetUnits / P + 1;  // more chunks than the 5 units
  const std::string many = error_of(data, r, rt);
  EXPECT_NE(many.find("pipeline.stages x pipeline.virtual_stages = " + std::to_string(P * r.virtual_stages) +
                      " model chunks, but the model has 5 UNet blocks"),
            std::string::npos)
      << many;
  r = unet_stages_of_world(1);
  std::vector<int64_t> firsts;
  for (int k = 1; k < P; ++k) firsts.push_back(k);
  firsts.back() = kUNetUnits;  // the list's last entry starts no chunk: the up blocks end at unit 4
  r.partition = firsts;
  const std::string listed = error_of(data, r, rt);
  EXPECT_NE(listed.find("pipeline.partition: UNet block " + std::to_string(kUNetUnits) + " cannot start a chunk"),
            std::string::npos)
      << listed;
}

// The same on GPUs (fp32), one stage per GPU: what crosses each cut (the hidden state, the skips and
// the time embedding, and their gradients) goes over NCCL. ZeRO 1 and 3 inside, 1F1B and ZB-H1.
TEST(UNetPipelineGpu, StagesOnGpusFollowOneGpu) {
  if (!every_rank_has_a_gpu() || world_size() < 2) GTEST_SKIP() << "needs two GPUs or more, one per rank";
  comm::Runtime rt;
  const int P = world_size();
  SharedDir dir("unet_pipeline_gpu");
  const std::string data = data_file(dir, "unet");
  const runtime::TrainResult want = unet_reference(data, P, rt, io::json(), "cuda");
  for (int zero : {1, 3})
    for (const std::string schedule : {"1f1b", "zb-h1"}) {
      TrainingRun r = unet_stages_of_world(zero);
      r.device = "cuda";
      r.schedule = schedule;
      expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), want,
                             "unet on " + std::to_string(P) + " GPUs as stages, ZeRO " + std::to_string(zero) + " " +
                                 schedule);
    }
}

}  // namespace zp::test
