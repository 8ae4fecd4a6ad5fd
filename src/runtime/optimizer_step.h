// The optimizer side of a training step, shared by the LM and the diffusion loops. Before each
// micro-step the engine learns whether its backward completes the step (ZeRO 0/1 reduce then) and,
// with optimizer.step_in_backward, the update each block gets as its gradients complete. At the end:
// average the gradients over the data group, take their global norm, skip the update on an fp16
// overflow (the scaler decides, from the norm every rank shares; ZeroEngine::skip_step, which with
// the delayed update still publishes the previous update's weights), clip to `grad_clip`, and run
// AdamW at the schedule's learning rate (and, with OneCycle's momentum cycling, its betas).
#pragma once
#include "parallel/zero_engine.h"
#include "runtime/loss_scaler.h"
#include "runtime/lr_schedule.h"
#include "runtime/train_config.h"

namespace zp::runtime {

// The optimizer's hyperparameters from the configuration.
parallel::AdamWHyper adamw_hyper(const TrainConfig& cfg);
// What the ZeRO engine shards and where it keeps each state, from the configuration.
parallel::ShardingPolicy sharding_policy(const TrainConfig& cfg);

// What the schedule sets for optimizer update `step` (from 0): its learning rate, and its betas
// where it cycles them (LrSchedule::betas_at).
parallel::ScheduledHyper scheduled_hyper(const LrSchedule& schedule, int64_t step);

struct StepUpdate {
  double grad_norm = 0;  // of the unscaled gradients, before clipping
  double lr = 0;
  bool skipped = false;  // not finite: no update this step
};

void begin_micro_step(parallel::ZeroEngine& engine, const LrSchedule& schedule, int64_t micro, int64_t grad_accum,
                      float loss_scale);

// A pipeline stage's part in the update (issue 12): its copy of a tied embedding has its gradients
// summed with the other stage's copy (the first and the last stage hold one each), and the global
// norm adds up over the stages, counting the tied block once (the last stage's replica is left out).
struct PipelineGradients {
  const nn::ParamBlock* tied = nullptr;  // this stage's copy of the tied embedding, if any
  comm::Communicator* tied_group = nullptr;  // the two stages holding a copy, at this data coordinate
  bool tied_is_replica = false;
  comm::Communicator* stages = nullptr;  // host scalars over the pipeline group (MPI)
};

StepUpdate finish_step(parallel::ZeroEngine& engine, LossScaler& scaler, const LrSchedule& schedule, double grad_clip,
                       float loss_scale, const PipelineGradients* pipeline = nullptr);

}  // namespace zp::runtime
