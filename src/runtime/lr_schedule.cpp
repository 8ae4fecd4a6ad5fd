#include "runtime/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace zp::runtime {

double LrSchedule::at(int64_t step) const {
  if (step < warmup) return lr * double(step + 1) / double(warmup);
  if (type == "WarmupLR" || total <= warmup) return lr;
  const double progress = std::clamp(double(step - warmup) / double(total - warmup), 0.0, 1.0);
  const double min_lr = min_ratio * lr;
  if (type == "WarmupDecayLR") return lr - (lr - min_lr) * progress;
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace zp::runtime
