// `zeropipe plan` plans each pipeline stage from the layout the trainer builds
// (runtime/pipeline_chunks.h): the check, shared by the LM's and the UNet's pipeline suites, that for
// this rank's stage the planner's parameters, trained parameters, model states and in-flight
// activations are those of the trainer's start-up check over the blocks its task lays out.
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallel/zero_engine.h"
#include "runtime/optimizer_step.h"
#include "runtime/run_plan.h"
#include "runtime/training_place.h"
#include "runtime/training_task.h"
#include "training_runs.h"

namespace zp::test {

inline void expect_stage_plan_is_the_trainers(const std::string& data, const TrainingRun& r, comm::Runtime& rt,
                                              MPI_Comm group, const std::string& what) {
  const io::Config user = user_config(data, r);
  const bool unet = r.model == "unet";
  std::optional<runtime::UNetTrainConfig> diffusion;
  if (unet) diffusion.emplace(runtime::UNetTrainConfig::from(user));
  const runtime::TrainConfig given = unet ? diffusion->common : runtime::TrainConfig::from(user);
  const runtime::TrainingPlace at = runtime::place_training(given, rt, group);
  const runtime::TrainConfig cfg = given.resolve_for_place(at.data_size(), at.world(), at.dev);
  const std::unique_ptr<runtime::TrainingTask> task =
      unet ? runtime::make_unet_task(cfg, diffusion->diffusion, at) : runtime::make_lm_task(cfg, at);
  const std::vector<nn::ParamBlock*> blocks = task->lay_out_model(parallel::shard_pad_multiple(at.data_size()));
  const runtime::RunPlan trainer = runtime::plan_run(blocks, runtime::sharding_policy(cfg), cfg, at.data_size(), 1,
                                                     task->activation_bytes(), true, "");
  const runtime::PipelinePlan planner = runtime::plan_pipeline(cfg, unet, at.world(), 1);
  ASSERT_EQ(planner.stages.size(), size_t(r.stages)) << what;
  const runtime::RunPlan& mine = planner.stages[size_t(at.stage())].plan;
  EXPECT_EQ(mine.states.params, trainer.states.params) << what;
  EXPECT_EQ(mine.trained_params, trainer.trained_params) << what;
  EXPECT_EQ(mine.states.world, at.data_size()) << what;
  EXPECT_DOUBLE_EQ(mine.states.device_bytes(), trainer.states.device_bytes()) << what;
  EXPECT_DOUBLE_EQ(mine.activation_bytes, trainer.activation_bytes) << what;
  EXPECT_GT(mine.activation_bytes, 0.0) << what;
}

// The check at P2 x D2 with ZeRO-3 inside each stage on the first four ranks (nothing with fewer), for
// `model`'s run (`layers` for an LM) with each of `schedules` (M = 3) and the "parameters" partition
// and a cut after unit 1.
inline void expect_p2_x_d2_stage_plans_are_the_trainers(const std::string& data, const std::string& model,
                                                        int64_t layers, const std::vector<std::string>& schedules,
                                                        comm::Runtime& rt) {
  if (world_size() < 4) return;
  MPI_Comm group = first_ranks(4);
  if (group == MPI_COMM_NULL) return;
  for (const std::string& schedule : schedules)
    for (const io::json partition : {io::json("parameters"), io::json::array({1})}) {
      TrainingRun r{model, 3, 4};
      r.stages = 2;
      r.grad_accum = 3;
      r.layers = layers;
      r.schedule = schedule;
      r.partition = partition;
      expect_stage_plan_is_the_trainers(data, r, rt, group,
                                        model + " P2 x D2 ZeRO-3 " + schedule + " " + partition.dump() + " rank " +
                                            std::to_string(world_rank()));
    }
  MPI_Comm_free(&group);
}

}  // namespace zp::test
