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

}  // namespace zp::parallel
