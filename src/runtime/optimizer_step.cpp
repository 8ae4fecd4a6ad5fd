#include "runtime/optimizer_step.h"

#include <cmath>

namespace zp::runtime {

StepUpdate finish_step(parallel::ZeroEngine& engine, LossScaler& scaler, const LrSchedule& schedule, double grad_clip,
                       float loss_scale) {
  StepUpdate u;
  engine.finish_gradients();
  u.grad_norm = std::sqrt(engine.grad_norm_squared()) / loss_scale;
  u.skipped = scaler.update(!std::isfinite(u.grad_norm));
  u.lr = schedule.at(engine.optimizer_steps());
  if (!u.skipped) {
    const double clip = grad_clip > 0 && u.grad_norm > grad_clip ? grad_clip / u.grad_norm : 1.0;
    engine.step(float(clip / loss_scale), u.lr);
  }
  return u;
}

}  // namespace zp::runtime
