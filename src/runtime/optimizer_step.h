// The optimizer side of a training step, shared by the LM and the diffusion loops. Before each
// micro-step the engine learns whether its backward completes the step (ZeRO 0/1 reduce then) and,
// with optimizer.step_in_backward, the update each block gets as its gradients complete. At the end:
// average the gradients over the data group, take their global norm, skip the update on an fp16
// overflow (the scaler decides), clip to `grad_clip`, and run AdamW at the schedule's learning rate.
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

struct StepUpdate {
  double grad_norm = 0;  // of the unscaled gradients, before clipping
  double lr = 0;
  bool skipped = false;  // not finite: no update this step
};

void begin_micro_step(parallel::ZeroEngine& engine, const LrSchedule& schedule, int64_t micro, int64_t grad_accum,
                      float loss_scale);

StepUpdate finish_step(parallel::ZeroEngine& engine, LossScaler& scaler, const LrSchedule& schedule, double grad_clip,
                       float loss_scale);

}  // namespace zp::runtime
