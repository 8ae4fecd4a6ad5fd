#include "runtime/loss_scaler.h"

#include <algorithm>

namespace zp::runtime {

bool LossScaler::update(bool overflow) {
  if (!overflow) {
    if (consecutive_) left_ = hysteresis_;
    if (enabled_ && ++clean_ >= window_) {
      scale_ *= 2;
      clean_ = 0;
      left_ = hysteresis_;
    }
    return false;
  }
  ++skipped_;
  clean_ = 0;
  if (!enabled_) return true;
  if (left_ <= 1)
    scale_ = std::max(min_, scale_ / 2);
  else
    --left_;
  return true;
}

}  // namespace zp::runtime
