// Pipeline parallelism (issue 12) on the CPU backend: a pipelined run follows the single-rank
// trajectory within 1e-5 (fp32) for Llama and tied GPT-2, with ZeRO 0-3 inside each stage, 1F1B and
// interleaved schedules, uneven partitions, several data-parallel pipelines (P2 x D2) and the
// optimizer offloaded inside a stage; bad layouts are errors naming their keys.
#include "training_runs.h"

namespace zp::test {
namespace {

// Six layers: uneven cuts into 4 and 5 chunks; enough for interleaved P2 x V2 and P3 x V2.
constexpr int64_t kLayers = 6;

// The single-rank run every layout with `accum` micro-batches must follow (run on world rank 0,
// broadcast to the others).
runtime::TrainResult reference(const std::string& data, const std::string& model, int accum, comm::Runtime& rt) {
  TrainingRun r{model, 0, 1};
  r.grad_accum = accum;
  r.layers = kLayers;
  runtime::TrainResult res;
  MPI_Comm one = first_ranks(1);
  if (one != MPI_COMM_NULL) {
    res = run(data, r, rt, one, true);
    MPI_Comm_free(&one);
  }
  int n[2] = {int(res.losses.size()), int(res.final_params.size())};
  MPI_Bcast(n, 2, MPI_INT, 0, MPI_COMM_WORLD);
  res.losses.resize(size_t(n[0]));
  res.final_params.resize(size_t(n[1]));
  MPI_Bcast(res.losses.data(), n[0], MPI_DOUBLE, 0, MPI_COMM_WORLD);
  MPI_Bcast(res.final_params.data(), n[1], MPI_FLOAT, 0, MPI_COMM_WORLD);
  return res;
}

std::string error_of(const std::string& data, const TrainingRun& r, comm::Runtime& rt) {
  try {
    run(data, r, rt, MPI_COMM_WORLD);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// All the ranks as P stages of one pipeline (P = the world: 2, 3 or 5), every ZeRO stage inside,
// 1F1B (M = P) and, where the layers allow, interleaved with two chunks per stage.
TEST(Pipeline, StagesFollowTheSingleRankTrajectory) {
  comm::Runtime rt;
  const int P = world_size();
  for (const std::string model : {"llama", "gpt2"}) {
    SharedDir dir("pipeline_" + model);
    const std::string data = data_file(dir, model);
    const runtime::TrainResult want = reference(data, model, P, rt);
    for (int zero = 0; zero <= 3; ++zero)
      for (const std::string schedule : {"1f1b", "interleaved"}) {
        if (schedule == "interleaved" && 2 * P > kLayers) continue;
        TrainingRun r{model, zero, P};
        r.stages = P;
        r.grad_accum = P;
        r.layers = kLayers;
        r.schedule = schedule;
        r.virtual_stages = schedule == "interleaved" ? 2 : 1;
        expect_same_trajectory(run(data, r, rt, MPI_COMM_WORLD, true), want,
                               model + " P" + std::to_string(P) + " ZeRO " + std::to_string(zero) + " " + schedule);
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
  TrainingRun c{"llama", 1, world};
  c.stages = world;
  c.grad_accum = world;
  c.layers = kLayers;
  c.dir = dir / "ckpt";
  c.save_every = 2;
  EXPECT_NE(error_of(data, c, rt).find("pipelined checkpoints are not implemented yet"), std::string::npos);
}

}  // namespace zp::test
