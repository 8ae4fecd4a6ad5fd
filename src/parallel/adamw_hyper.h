// AdamW's hyperparameters as the configuration gives them (optimizer.params, runtime/optimizer_step.h).
#pragma once

namespace zp::parallel {

struct AdamWHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool decay_all = false;  // weight decay on every parameter, not only those marked `decay`
  // The ZeRO engine updates each block as soon as its gradients are complete in the backward
  // (optimizer.step_in_backward): no step-long gradient buffers, but no clipping by the global norm.
  bool step_in_backward = false;
};

// What the learning-rate schedule sets for one update (runtime/lr_schedule.h): the learning rate and,
// with OneCycle's momentum cycling, the betas. A negative value keeps the configured one. AdamW's
// bias correction then uses this update's beta1 and beta2 (1 - beta^t, t the update's number), as
// torch's AdamW and DeepSpeed's Adam do when a scheduler changes them.
struct ScheduledHyper {
  double lr = -1.0, beta1 = -1.0, beta2 = -1.0;
};

}  // namespace zp::parallel
