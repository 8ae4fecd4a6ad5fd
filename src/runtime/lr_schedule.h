// Learning-rate schedules (DeepSpeed names): linear warmup from 0, then
//   WarmupCosineLR: cosine decay to min_ratio * lr at total_steps;
//   WarmupDecayLR:  linear decay to min_ratio * lr at total_steps;
//   WarmupLR:       constant lr.
// `step` counts optimizer updates from 0.
#pragma once
#include <cstdint>
#include <string>

namespace zp::runtime {

struct LrSchedule {
  std::string type = "WarmupCosineLR";
  double lr = 6e-4, min_ratio = 0.1;
  int64_t warmup = 0, total = 1;
  double at(int64_t step) const;
};

}  // namespace zp::runtime
