// Dynamic loss scaling for fp16 (DeepSpeed semantics): the loss is multiplied by `scale` before the
// backward; a step whose gradients hold inf/nan is skipped and, after `hysteresis` consecutive
// overflows, the scale halves (not below min_scale); after `window` clean steps it doubles.
#pragma once
#include <cstdint>

namespace zp::runtime {

class LossScaler {
 public:
  LossScaler(bool enabled, double initial, double min_scale, int64_t window, int64_t hysteresis)
      : enabled_(enabled), scale_(enabled ? initial : 1.0), min_(min_scale), window_(window),
        hysteresis_(hysteresis), left_(hysteresis) {}
  double scale() const { return scale_; }
  double min_scale() const { return min_; }
  bool enabled() const { return enabled_; }
  // Records the outcome of a step; returns true when the step must be skipped.
  bool update(bool overflow);
  int64_t skipped() const { return skipped_; }

 private:
  bool enabled_;
  double scale_, min_;
  int64_t window_, hysteresis_, left_, clean_ = 0, skipped_ = 0;
};

}  // namespace zp::runtime
