// Pipeline parallelism (issue 12) on the CPU backend: a pipelined run follows the single-rank
// trajectory within 1e-5 (fp32) for Llama and tied GPT-2, with ZeRO 0-3 inside each stage, 1F1B,
// interleaved and zero-bubble (ZB-H1, split backward) schedules, uneven partitions, several data-parallel pipelines (P2 x D2) and the
// optimizer offloaded inside a stage, ZeRO-3 stages that keep their weights gathered for the step;
// bad layouts are errors naming their keys. Pipelined
// checkpoints resume bit for bit in their own layout and to rounding in any other, and a damaged
// one is skipped by every stage together.
#include <cstring>
#include <fstream>

#include "core/device.h"
#include "io/checkpoint_file.h"
#include "parallel/zero_engine.h"
#include "runtime/optimizer_step.h"
#include "runtime/run_plan.h"
#include "runtime/training_place.h"
#include "runtime/training_task.h"
#include "stage_plan_check.h"
#include "training_runs.h"

namespace zp::test {
namespace {

// Six layers: uneven cuts into 4 and 5 chunks; enough for interleaved P2 x V2 and P3 x V2.
constexpr int64_t kLayers = 6;

// The single-rank run every layout with `accum` micro-batches must follow (run on world rank 0,
// broadcast to the others).
runtime::TrainResult reference(const std::string& data, const std::string& model, int accum, comm::Runtime& rt,
                               const std::string& device = "cpu") {
  TrainingRun r{model, 0, 1};
  r.device = device;
  r.grad_accum = accum;
  r.layers = kLayers;
  return single_rank_reference(data, r, rt);
}

}  // namespace

// All the ranks as P stages of one pipeline (P = the world: 2, 3 or 5), every ZeRO stage inside,
// 1F1B and ZB-H1 (M = P) and, where the layers allow, interleaved with two chunks per stage. ZB-H1's
// gradients come from other passes in another order (the layers' weight gradients in W passes,
// reduced after the chunk's last W): the same trajectory.
TEST(Pipeline, StagesFollowTheSingleRankTrajectory) {
  comm::Runtime rt;
  const int P = world_size();
  for (const std::string model : {"llama", "gpt2"}) {
    SharedDir dir("pipeline_" + model);
    const std::string data = data_file(dir, model);
    const runtime::TrainResult want = reference(data, model, P, rt);
    for (int zero = 0; zero <= 3; ++zero)
      for (const std::string schedule : {"1f1b", "interleaved", "zb-h1"}) {
        if (schedule == "interleaved" && 2 * P > kLayers) continue;
        TrainingRun r{model, zero, P};
        r.stages = P;
        r.grad_accum = P;
        r.layers = kLayers;
        r.schedule = schedule;
        r.virtual_stages = schedule == "interleaved" ? 2 : 1;
        expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), want,
                               model + " P" + std::to_string(P) + " ZeRO " + std::to_string(zero) + " " + schedule);
        if (zero == 3) {  // each block gathered once per step instead of once per micro-batch
          r.keep_gathered = true;
          expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), want,
                                 model + " P" + std::to_string(P) + " ZeRO 3 keep_gathered " + schedule);
        }
      }
  }
}

// Two pipelines of two stages (P2 x D2) on the first four ranks, explicit and uniform partitions,
// more micro-batches than stages; and the optimizer offloaded to the CPU inside each stage.
TEST(Pipeline, DataParallelPipelinesAndOffloadInsideAStage) {
  comm::Runtime rt;
  if (world_size() < 4 && world_size() != 2) GTEST_SKIP() << "needs 2 or at least 4 ranks";
  const int world = world_size() >= 4 ? 4 : 2;
  MPI_Comm group = first_ranks(world);
  for (const std::string model : {"llama", "gpt2"}) {
    SharedDir dir("pipeline_dp_" + model);
    const std::string data = data_file(dir, model);
    const runtime::TrainResult want = reference(data, model, 3, rt);
    if (group == MPI_COMM_NULL) continue;
    for (int zero : {1, 2, 3}) {
      TrainingRun r{model, zero, world};
      r.stages = 2;
      r.grad_accum = 3;
      r.layers = kLayers;
      r.partition = zero == 1 ? io::json::array({1}) : io::json("uniform");  // 1 | 5 layers, or 3 | 3
      const std::string what = model + " P2 x D" + std::to_string(world / 2) + " ZeRO " + std::to_string(zero);
      expect_same_trajectory(run(data, r, rt, group, true), want, what);
      if (zero == 2) {
        r.offload = "cpu";
        expect_same_trajectory(run(data, r, rt, group, true), want, what + ", optimizer offloaded to the CPU");
      }
      if (zero == 3) {
        r.keep_gathered = true;
        expect_same_trajectory(run(data, r, rt, group, true), want, what + ", keep_gathered");
        r.keep_gathered = false;
      }
      // ZB-H1 with more micro-batches than stages (W passes pending across the steady state) and an
      // uneven cut.
      r.schedule = "zb-h1";
      r.offload = "none";
      r.partition = io::json::array({2});
      expect_same_trajectory(run(data, r, rt, group, true), want, what + ", zb-h1, layers 2 | 4");
    }
  }
  if (group != MPI_COMM_NULL) MPI_Comm_free(&group);
}

TEST(Pipeline, BadLayoutsAreErrorsNamingTheKeys) {
  comm::Runtime rt;
  const int world = world_size();
  SharedDir dir("pipeline_bad");
  const std::string data = data_file(dir, "llama");
  TrainingRun r{"llama", 1, world};
  r.layers = 2;
  r.stages = world;
  r.grad_accum = world;
  if (world > 2)  // more chunks than layers
    EXPECT_NE(error_of(data, r, rt).find("model chunks, but the model has 2 layers"), std::string::npos);
  r.layers = kLayers;
  r.grad_accum = world - 1;  // fewer micro-batches than stages: the configuration's own check
  try {
    runtime::TrainConfig::from(user_config(data, r));
    ADD_FAILURE() << "1f1b with fewer micro-batches than stages was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gradient_accumulation_steps (the micro-batches per step, " +
                                         std::to_string(world - 1) + ") >= pipeline.stages"),
              std::string::npos)
        << e.what();
  }
  r.stages = world + 1;  // does not divide the world
  r.world = world + 1;   // (so that the micro-batch stays whole)
  r.grad_accum = world + 1;
  EXPECT_NE(error_of(data, r, rt).find("does not divide the world size " + std::to_string(world)), std::string::npos);
}

namespace {

// All the ranks as P stages of one pipeline, `accum` = P micro-batches.
TrainingRun stages_of_world(const std::string& model, int zero) {
  TrainingRun r{model, zero, world_size()};
  r.stages = world_size();
  r.grad_accum = world_size();
  r.layers = kLayers;
  return r;
}

}  // namespace

// 6 steps straight against 3, save, resume, 3 in the same pipelined layout: bit for bit. The file
// holds the whole model once (the tied embedding's replica on the last stage is not written) and
// every element of every dataset is covered by a checksummed slice.
TEST(Pipeline, CheckpointsResumeBitwiseInTheSameLayout) {
  comm::Runtime rt;
  for (const std::string model : {"gpt2", "llama"}) {
    SharedDir dir("pipeline_resume_" + model);
    const std::string data = data_file(dir, model);
    TrainingRun r = stages_of_world(model, model == "gpt2" ? 1 : 3);
    const runtime::TrainResult straight = run(data, r, rt, MPI_COMM_WORLD, true);
    r.dir = dir / "ckpt";
    r.max_steps = kSaveAt;
    r.save_every = kSaveAt;
    const runtime::TrainResult first = run(data, r, rt, MPI_COMM_WORLD);
    r.max_steps = kSteps;
    r.resume = "latest";
    const runtime::TrainResult second = run(data, r, rt, MPI_COMM_WORLD, true);
    const std::string what = model + " in " + std::to_string(world_size()) + " stages";
    ASSERT_EQ(first.saved.size(), 1u) << what;
    EXPECT_EQ(second.resumed_from, first.saved[0]) << what;
    EXPECT_EQ(second.first_step, kSaveAt) << what;
    EXPECT_EQ(second.losses, tail(straight.losses, kSaveAt)) << what << ": losses after the resume, bit for bit";
    ASSERT_EQ(second.final_params.size(), straight.final_params.size()) << what;
    size_t differ = 0;
    for (size_t i = 0; i < straight.final_params.size(); ++i)
      differ += std::memcmp(&second.final_params[i], &straight.final_params[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << what << ": final parameters, bit for bit";

    const io::ChecksumReport report = io::verify_checksums(first.saved[0], MPI_COMM_WORLD);
    EXPECT_TRUE(report.ok()) << what << ": " << (report.problems.empty() ? "" : report.problems.front());
    if (world_rank() == 0) {
      const io::H5File f = io::H5File::open(first.saved[0]);
      EXPECT_EQ(f.attr_int("/", "pipeline_stages"), world_size());
      EXPECT_EQ(f.attr_int("/", "world_size"), world_size());
      // Every parameter once: the single-rank reference has the same count of values.
      int64_t values = 0;
      for (const std::string& c : f.children("/model")) values += f.dataset_info("/model/" + c).numel();
      EXPECT_EQ(values, int64_t(straight.final_params.size())) << what;
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

// A checkpoint written in one layout resumes in another and steps 4-6 follow the single-rank run
// to 1e-5: P stages -> all ranks data-parallel (no pipeline) and -> one rank; data-parallel -> P
// stages (interleaved where the layers allow); with 4 ranks or more, P2 x D2 -> P stages.
TEST(Pipeline, CheckpointsReshardBetweenLayouts) {
  comm::Runtime rt;
  const int P = world_size();
  for (const std::string model : {"gpt2", "llama"}) {
    SharedDir dir("pipeline_reshard_" + model);
    const std::string data = data_file(dir, model);
    runtime::TrainResult want = reference(data, model, P, rt);
    want.losses = tail(want.losses, kSaveAt);
    const std::string ckpt = dir / "ckpt";
    auto saved_by = [&](const TrainingRun& r, const std::string& sub) {
      return save_at_half(data, r, ckpt + "_" + sub, rt);
    };
    auto resumes = [&](const TrainingRun& r, const std::string& file, const std::string& what) {
      expect_resume_follows(data, r, file, want, model + ": " + what, rt);
    };
    TrainingRun flat{model, 3, P};  // all ranks data-parallel, one micro-batch each: the same global batch
    flat.layers = kLayers;
    TrainingRun one{model, 0, 1};
    one.grad_accum = P;
    one.layers = kLayers;

    const std::string from_stages = saved_by(stages_of_world(model, 2), "stages");
    resumes(flat, from_stages, "saved by " + std::to_string(P) + " stages, resumed data-parallel at ZeRO 3");
    resumes(one, from_stages, "saved by " + std::to_string(P) + " stages, resumed by one rank");

    flat.stage = 1;
    const std::string from_flat = saved_by(flat, "flat");
    TrainingRun staged = stages_of_world(model, 3);
    if (2 * P <= kLayers) {
      staged.schedule = "interleaved";
      staged.virtual_stages = 2;
    }
    resumes(staged, from_flat, "saved data-parallel at ZeRO 1, resumed by " + std::to_string(P) + " stages " +
                                   staged.schedule);
    if (P >= 4) {
      TrainingRun grid{model, 3, 4};
      grid.stages = 2;
      grid.grad_accum = 3;
      grid.layers = kLayers;
      resumes(stages_of_world(model, 1), saved_by(grid, "grid"),
              "saved by P2 x D2 at ZeRO 3, resumed by " + std::to_string(P) + " stages at ZeRO 1");
    }
  }
}

// ZB-H1 checkpoints are the same file: saved by P zb-h1 stages (ZeRO 2), resumed by one rank; saved
// data-parallel, resumed by P zb-h1 stages (ZeRO 3, activation checkpointing inside); both follow the
// single-rank run to 1e-5.
TEST(Pipeline, ZeroBubbleRunsSaveAndResume) {
  comm::Runtime rt;
  const int P = world_size();
  const std::string model = "llama";
  SharedDir dir("pipeline_zb_resume");
  const std::string data = data_file(dir, model);
  runtime::TrainResult want = reference(data, model, P, rt);
  want.losses = tail(want.losses, kSaveAt);
  TrainingRun staged = stages_of_world(model, 2);
  staged.schedule = "zb-h1";
  TrainingRun one{model, 0, 1};
  one.grad_accum = P;
  one.layers = kLayers;
  expect_resume_follows(data, one, save_at_half(data, staged, dir / "ckpt_staged", rt), want,
                        "saved by " + std::to_string(P) + " zb-h1 stages, resumed by one rank", rt);
  TrainingRun flat{model, 1, P};
  flat.layers = kLayers;
  staged.stage = 3;
  staged.activation_checkpointing = true;
  expect_resume_follows(data, staged, save_at_half(data, flat, dir / "ckpt_flat", rt), want,
                        "saved data-parallel, resumed by " + std::to_string(P) + " zb-h1 stages at ZeRO 3, "
                        "checkpointed activations", rt);
}

// LoRA under zb-h1: the adapters' gradients stay in B (W has nothing to do), and the run still
// follows one rank: Llama's q, v and down projections adapted, P = the world.
TEST(Pipeline, ZeroBubbleWithLoraFollowsOneRank) {
  comm::Runtime rt;
  const int P = world_size();
  SharedDir dir("pipeline_zb_lora");
  const std::string data = data_file(dir, "llama");
  const io::json lora = {{"r", 4}, {"alpha", 8}, {"dropout", 0.1}, {"target_modules", {"q_proj", "v_proj", "down_proj"}}};
  TrainingRun one{"llama", 0, 1};
  one.grad_accum = P;
  one.layers = kLayers;
  one.lora = lora;
  const runtime::TrainResult want = single_rank_reference(data, one, rt);
  TrainingRun r = stages_of_world("llama", 2);
  r.schedule = "zb-h1";
  r.lora = lora;
  expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), want,
                         "LoRA in " + std::to_string(P) + " zb-h1 stages, ZeRO 2");
}

// A damaged dataset that only the last stage reads (the final norm's moment): every rank of every
// stage skips the newest checkpoint together and resumes the one before.
TEST(Pipeline, EveryStageSkipsADamagedCheckpointTogether) {
  comm::Runtime rt;
  SharedDir dir("pipeline_damaged");
  const std::string data = data_file(dir, "llama");
  TrainingRun r = stages_of_world("llama", 1);
  r.dir = dir / "ckpt";
  r.max_steps = 2;
  r.save_every = 1;
  const runtime::TrainResult first = run(data, r, rt, MPI_COMM_WORLD);
  ASSERT_EQ(first.saved.size(), 2u);
  if (world_rank() == 0) {
    int64_t at = 0;
    {
      const io::H5File f = io::H5File::open(first.saved[1]);
      at = f.dataset_info("/optimizer/model.norm.weight/exp_avg").file_offset;
    }
    std::fstream io(first.saved[1], std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(at);
    io.write("garbage!", 8);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  r.max_steps = 3;
  r.resume = "latest";
  const runtime::TrainResult second = run(data, r, rt, MPI_COMM_WORLD);
  EXPECT_EQ(second.resumed_from, first.saved[0]);
  EXPECT_EQ(second.first_step, 1);
  EXPECT_EQ(second.losses.size(), 2u);
  EXPECT_TRUE(std::filesystem::exists(first.saved[1] + ".damaged"));
}

}  // namespace zp::test

namespace zp::test {

// On GPUs, one per rank, with NCCL between the stages: all the ranks as P stages, ZeRO 1 and 3
// inside, 1F1B, interleaved and ZB-H1, follow one GPU within 1e-5 (fp32); a pipelined checkpoint resumes
// data-parallel on the same GPUs and follows it too.
// `zeropipe plan` plans each stage from the layout the trainer builds (runtime/pipeline_chunks.h): for
// this rank's stage, the planner's parameters, model states and in-flight activations are those of
// the trainer's start-up check over the blocks it lays out, for each schedule and partition, with
// every rank a stage and (4 ranks or more) as P2 x D2 with ZeRO-3 sharding within each stage.
TEST(Pipeline, ThePlanOfAStageIsWhatTheTrainerBuilds) {
  comm::Runtime rt;
  SharedDir dir("pipeline_plan");
  const std::string data = data_file(dir, "llama");
  const int P = world_size();
  for (const std::string schedule : {"1f1b", "zb-h1", "interleaved"})
    for (const io::json partition : {io::json("parameters"), io::json("compute"), io::json("uniform")}) {
      if (schedule == "interleaved" && 2 * P > kLayers) continue;
      TrainingRun r{"llama", 2, P};
      r.stages = P;
      r.grad_accum = P;
      r.layers = kLayers;
      r.schedule = schedule;
      r.virtual_stages = schedule == "interleaved" ? 2 : 1;
      r.partition = partition;
      expect_stage_plan_is_the_trainers(data, r, rt, MPI_COMM_WORLD,
                                        schedule + " " + partition.dump() + " P" + std::to_string(P) + " rank " +
                                            std::to_string(world_rank()));
    }
  expect_p2_x_d2_stage_plans_are_the_trainers(data, "llama", kLayers, {"1f1b"}, rt);
}

TEST(PipelineGpu, StagesOnGpusFollowOneGpu) {
  if (!every_rank_has_a_gpu() || world_size() < 2) GTEST_SKIP() << "needs two GPUs or more, one per rank";
  comm::Runtime rt;
  const int P = world_size();
  for (const std::string model : {"gpt2", "llama"}) {
    SharedDir dir("pipeline_gpu_" + model);
    const std::string data = data_file(dir, model);
    runtime::TrainResult want = reference(data, model, P, rt, "cuda");
    for (int zero : {1, 3})
      for (const std::string schedule : {"1f1b", "interleaved", "zb-h1"}) {
        if (schedule == "interleaved" && 2 * P > kLayers) continue;
        TrainingRun r = stages_of_world(model, zero);
        r.device = "cuda";
        r.schedule = schedule;
        r.virtual_stages = schedule == "interleaved" ? 2 : 1;
        expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), want,
                               model + " on " + std::to_string(P) + " GPUs as stages, ZeRO " + std::to_string(zero) +
                                   " " + schedule);
      }
    TrainingRun r = stages_of_world(model, 3);
    r.device = "cuda";
    r.dir = dir / "ckpt";
    r.max_steps = kSaveAt;
    r.save_every = kSaveAt;
    run(data, r, rt, MPI_COMM_WORLD);
    TrainingRun flat{model, 2, P};
    flat.device = "cuda";
    flat.layers = kLayers;
    flat.resume = r.dir + "/" + io::checkpoint_filename(kSaveAt);
    const runtime::TrainResult got = run(data, flat, rt, MPI_COMM_WORLD, true);
    EXPECT_EQ(got.first_step, kSaveAt);
    want.losses = tail(want.losses, kSaveAt);
    expect_same_trajectory(got, want, model + ": saved by " + std::to_string(P) + " GPU stages, resumed data-parallel",
                           kSaveAt);
  }
}

}  // namespace zp::test
