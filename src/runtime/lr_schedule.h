// Learning-rate schedules with DeepSpeed's names, parameters and formulas
// (deepspeed/runtime/lr_schedules.py), so a run follows the learning rates DeepSpeed would give it:
//   WarmupLR:       warmup_min_lr -> warmup_max_lr over warmup_num_steps ("log" or "linear"), then flat;
//   WarmupDecayLR:  the same warmup, then linear decay back to warmup_min_lr at total_num_steps;
//   WarmupCosineLR: lr x a ratio warmed from warmup_min_ratio to 1, then cosine to cos_min_ratio;
//   OneCycle:       cycle_min_lr -> cycle_max_lr -> cycle_min_lr (optionally in stairs), then decay;
//                   with cycle_momentum, AdamW's beta1 the other way (cycle_max_mom -> cycle_min_mom ->
//                   cycle_max_mom), then decay_mom_rate; and beta2 0.99 throughout, as DeepSpeed sets
//                   both betas (its (cycle_min_mom, 0.99) / (cycle_max_mom, 0.99) pairs);
//   LRRangeTest:    lr_range_test_min_lr growing by lr_range_test_step_rate per step_size steps.
//
// DeepSpeed steps its scheduler after each optimizer step, starting from last_batch_iteration = -1,
// so update k (from 0) uses the schedule at iteration k - 1: the first update uses the schedule's
// starting value (warmup_min_lr, 0 for WarmupCosineLR, cycle_min_lr, lr_range_test_min_lr). Like
// DeepSpeed, a warmup lasts at least 2 iterations; unlike DeepSpeed, which refuses it,
// warmup_num_steps = 0 means no warmup (zeropipe's default).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace zp::runtime {

enum class WarmupShape { Log, Linear };

struct LrSchedule {
  std::string type = "WarmupCosineLR";  // WarmupLR | WarmupDecayLR | WarmupCosineLR | OneCycle | LRRangeTest
  // WarmupLR / WarmupDecayLR: absolute learning rates. WarmupCosineLR: ratios of `lr`.
  double lr = 6e-4;  // optimizer.params.lr (WarmupCosineLR's base)
  double warmup_min_lr = 0, warmup_max_lr = 6e-4;
  double warmup_min_ratio = 0, cos_min_ratio = 0.1;
  int64_t warmup_steps = 0, total_steps = 1;
  WarmupShape warmup_shape = WarmupShape::Linear;
  // OneCycle.
  double cycle_min_lr = 0, cycle_max_lr = 0, decay_lr_rate = 0;
  double cycle_first_step_size = 2000, cycle_second_step_size = 2000;
  int64_t cycle_first_stair_count = 0, cycle_second_stair_count = 0;
  double decay_step_size = 0;
  bool cycle_momentum = false;  // the configuration's default is DeepSpeed's, true
  double cycle_min_mom = 0.8, cycle_max_mom = 0.9, decay_mom_rate = 0;
  // LRRangeTest.
  double range_test_min_lr = 1e-3, range_test_step_rate = 1.0;
  int64_t range_test_step_size = 2000;
  bool range_test_staircase = false;

  // The learning rate of optimizer update `step` (counted from 0).
  double at(int64_t step) const;
  // AdamW's betas of update `step` where the schedule sets them (OneCycle with cycle_momentum).
  struct Betas {
    double beta1, beta2;
  };
  std::optional<Betas> betas_at(int64_t step) const;
};

// The beta2 DeepSpeed's OneCycle sets while it cycles beta1 (whatever optimizer.params.betas says).
constexpr double kOneCycleBeta2 = 0.99;

// DeepSpeed's formulas at scheduler iteration `iteration` (its last_batch_iteration, >= 0).
double warmup_lr(const LrSchedule& s, int64_t iteration);
double warmup_decay_lr(const LrSchedule& s, int64_t iteration);
double warmup_cosine_lr(const LrSchedule& s, int64_t iteration);
double one_cycle_lr(const LrSchedule& s, int64_t iteration);
double one_cycle_momentum(const LrSchedule& s, int64_t iteration);  // beta1 (get_mom)
double lr_range_test_lr(const LrSchedule& s, int64_t iteration);

}  // namespace zp::runtime
