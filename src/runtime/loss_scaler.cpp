#include "runtime/loss_scaler.h"

#include <algorithm>

namespace zp::runtime {

bool LossScaler::update(bool overflow) {
  if (!overflow) {
    left_ = hysteresis_;
    if (enabled_ && ++clean_ >= window_) {
      scale_ *= 2;
      clean_ = 0;
    }
    return false;
  }
  ++skipped_;
  clean_ = 0;
  if (enabled_ && --left_ <= 0) {
    scale_ = std::max(min_, scale_ / 2);
    left_ = hysteresis_;
  }
  return true;
}

}  // namespace zp::runtime
