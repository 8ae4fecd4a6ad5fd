// What a training run returns, and how it fails when training itself went wrong.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace zp::runtime {

struct TrainResult {
  std::vector<double> losses;  // mean training loss per optimizer step
  std::vector<double> val_losses;
  int64_t skipped_steps = 0;
  std::vector<float> final_params;  // fp32 master weights after the last step, when asked for
  int64_t first_step = 0;           // steps done before this run (> 0 when resumed)
  std::string resumed_from;         // the checkpoint it resumed from, "" when it started fresh
  std::vector<std::string> saved;   // checkpoints written, in order
  int stopped_by_signal = 0;        // the signal that stopped the run early (runtime/stop_signals.h), else 0
};

// Thrown on every rank together when the loss or the gradient norm stayed non-finite for
// training.max_bad_steps steps in a row (fp16: with the loss scale at its minimum); no checkpoint
// is written from such a state.
struct TrainingDiverged : Error {
  using Error::Error;
};

}  // namespace zp::runtime
