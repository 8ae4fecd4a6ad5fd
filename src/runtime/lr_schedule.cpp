#include "runtime/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace zp::runtime {
namespace {

// DeepSpeed stretches a warmup to at least 2 iterations (its log warmup divides by log(steps)).
int64_t warmup_length(const LrSchedule& s) { return s.warmup_steps == 0 ? 0 : std::max<int64_t>(2, s.warmup_steps); }

// How far a warmup has come at `iteration` (< its length), in [0, 1): DeepSpeed's _get_gamma.
double warmup_progress(const LrSchedule& s, int64_t iteration) {
  const double steps = double(warmup_length(s));
  if (s.warmup_shape == WarmupShape::Log) return std::log(double(iteration + 1)) / std::log(steps);
  return double(iteration) / steps;
}

// OneCycle's position in its cycle, 0 at cycle_min_lr and 1 at cycle_max_lr: _get_scale_factor.
double one_cycle_scale(const LrSchedule& s, int64_t iteration) {
  const double batch = double(iteration + 1);
  const double total = s.cycle_first_step_size + s.cycle_second_step_size;
  const double ratio = s.cycle_first_step_size / total;
  const double x = 1.0 + batch / total - std::floor(1.0 + batch / total);
  double scale = 0;
  int64_t stairs = 0;
  if (x <= ratio) {
    scale = x / ratio;
    stairs = s.cycle_first_stair_count;
  } else {
    scale = (x - 1) / (ratio - 1);
    stairs = s.cycle_second_stair_count;
  }
  if (stairs > 0) {  // held flat over each stair, counted from the integer position in the cycle
    const double in_cycle = std::fmod(batch, total);
    const double position = in_cycle <= s.cycle_first_step_size
                                ? in_cycle * double(stairs) / s.cycle_first_step_size
                                : (total - in_cycle) * double(stairs) / s.cycle_second_step_size;
    scale = std::floor(position) / double(stairs);
  }
  return scale;
}

}  // namespace

double warmup_lr(const LrSchedule& s, int64_t iteration) {
  const double gamma = iteration < warmup_length(s) ? warmup_progress(s, iteration) : 1.0;
  return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * gamma;
}

double warmup_decay_lr(const LrSchedule& s, int64_t iteration) {
  const int64_t warmup = warmup_length(s);
  if (iteration < warmup) return warmup_lr(s, iteration);
  const double left = double(s.total_steps - iteration) / std::max(1.0, double(s.total_steps - warmup));
  return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * std::max(0.0, left);
}

double warmup_cosine_lr(const LrSchedule& s, int64_t iteration) {
  const int64_t warmup = warmup_length(s);
  if (iteration < warmup)
    return s.lr * (s.warmup_min_ratio + warmup_progress(s, iteration) * (1.0 - s.warmup_min_ratio));
  const double progress = std::min(1.0, double(iteration - warmup + 1) / double(std::max<int64_t>(1, s.total_steps - warmup)));
  const double cosine = (1.0 + std::cos(M_PI * progress)) / 2.0;
  return s.lr * std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * cosine);
}

double one_cycle_lr(const LrSchedule& s, int64_t iteration) {
  const double total = s.cycle_first_step_size + s.cycle_second_step_size;
  if (double(iteration) < total) return s.cycle_min_lr + (s.cycle_max_lr - s.cycle_min_lr) * one_cycle_scale(s, iteration);
  if (s.decay_step_size == 0 || s.decay_lr_rate == 0) return s.cycle_min_lr;
  const double decay_interval = (double(iteration) - total + 1) / s.decay_step_size;
  return s.cycle_min_lr / (1.0 + s.decay_lr_rate * decay_interval);
}

// Inverse to the learning rate over the cycle (the same position, stairs included), then DeepSpeed's
// _get_decay_mom: cycle_max_mom times (1 + decay_mom_rate x decay intervals), growing for a positive
// rate (the configuration checks that it stays below 1 over the run).
double one_cycle_momentum(const LrSchedule& s, int64_t iteration) {
  const double total = s.cycle_first_step_size + s.cycle_second_step_size;
  if (double(iteration) < total)
    return s.cycle_max_mom - (s.cycle_max_mom - s.cycle_min_mom) * one_cycle_scale(s, iteration);
  if (s.decay_step_size == 0 || s.decay_mom_rate == 0) return s.cycle_max_mom;
  const double decay_interval = (double(iteration) - total + 1) / s.decay_step_size;
  return s.cycle_max_mom * (1.0 + s.decay_mom_rate * decay_interval);
}

double lr_range_test_lr(const LrSchedule& s, int64_t iteration) {
  double interval = double(iteration + 1) / double(s.range_test_step_size);
  if (s.range_test_staircase) interval = std::floor(interval);
  return s.range_test_min_lr * (1.0 + s.range_test_step_rate * interval);
}

double LrSchedule::at(int64_t step) const {
  const int64_t iteration = step - 1;
  // Before DeepSpeed's first scheduler step the optimizer holds the schedule's starting value.
  if (iteration < 0) {
    if (type == "WarmupCosineLR") return warmup_length(*this) == 0 ? lr : 0.0;
    if (type == "OneCycle") return cycle_min_lr;
    if (type == "LRRangeTest") return range_test_min_lr;
    return warmup_length(*this) == 0 ? warmup_max_lr : warmup_min_lr;
  }
  if (type == "WarmupLR") return warmup_lr(*this, iteration);
  if (type == "WarmupDecayLR") return warmup_decay_lr(*this, iteration);
  if (type == "OneCycle") return one_cycle_lr(*this, iteration);
  if (type == "LRRangeTest") return lr_range_test_lr(*this, iteration);
  return warmup_cosine_lr(*this, iteration);
}

std::optional<LrSchedule::Betas> LrSchedule::betas_at(int64_t step) const {
  if (type != "OneCycle" || !cycle_momentum) return std::nullopt;
  // Before its first step DeepSpeed's OneCycle has set the optimizer's betas to (cycle_min_mom, 0.99).
  const int64_t iteration = step - 1;
  return Betas{iteration < 0 ? cycle_min_mom : one_cycle_momentum(*this, iteration), kOneCycleBeta2};
}

}  // namespace zp::runtime
