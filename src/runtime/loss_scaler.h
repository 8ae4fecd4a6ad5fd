// Dynamic loss scaling for fp16 with DeepSpeed's semantics (DynamicLossScaler.update_scale): the loss
// is multiplied by `scale` before the backward; a step whose gradients hold inf/nan is skipped. An
// overflow uses up one unit of the hysteresis; when none is left (or the hysteresis is 1) the scale
// halves, not below min_scale, and keeps halving at each further overflow until the hysteresis is
// refilled. After `window` clean steps in a row the scale doubles and the hysteresis refills; with
// consecutive_hysteresis every clean step refills it.
#pragma once
#include <cstdint>

namespace zp::runtime {

class LossScaler {
 public:
  LossScaler(bool enabled, double initial, double min_scale, int64_t window, int64_t hysteresis,
             bool consecutive_hysteresis = false)
      : enabled_(enabled), consecutive_(consecutive_hysteresis), scale_(enabled ? initial : 1.0), min_(min_scale),
        window_(window), hysteresis_(hysteresis), left_(hysteresis) {}
  double scale() const { return scale_; }
  double min_scale() const { return min_; }
  bool enabled() const { return enabled_; }
  // Records the outcome of a step; returns true when the step must be skipped.
  bool update(bool overflow);
  int64_t skipped() const { return skipped_; }

  // What a checkpoint keeps besides the scale: overflows still absorbed before the scale halves, and
  // clean steps towards the next doubling.
  int64_t overflows_left() const { return left_; }
  int64_t clean_steps() const { return clean_; }
  void restore(double scale, int64_t overflows_left, int64_t clean_steps) {
    scale_ = scale;
    left_ = overflows_left;
    clean_ = clean_steps;
  }

 private:
  bool enabled_, consecutive_;
  double scale_, min_;
  int64_t window_, hysteresis_, left_, clean_ = 0, skipped_ = 0;
};

}  // namespace zp::runtime
