// The end of a training step, shared by the LM and the diffusion loops: average the gradients over
// the data group, take their global norm, skip the update on an fp16 overflow (the scaler decides),
// clip to `grad_clip`, and run AdamW at the schedule's learning rate.
#pragma once
#include "parallel/zero_engine.h"
#include "runtime/loss_scaler.h"
#include "runtime/lr_schedule.h"

namespace zp::runtime {

struct StepUpdate {
  double grad_norm = 0;  // of the unscaled gradients, before clipping
  double lr = 0;
  bool skipped = false;  // not finite: no update this step
};

StepUpdate finish_step(parallel::ZeroEngine& engine, LossScaler& scaler, const LrSchedule& schedule, double grad_clip,
                       float loss_scale);

}  // namespace zp::runtime
