// The training loop of `zeropipe train`: data-parallel over all ranks (gradients averaged over the
// data group after the last micro-step), gradient accumulation, global-norm clipping, AdamW with a
// warmup/decay schedule, bf16/fp16/fp32 compute with fp32 master weights, fp16 dynamic loss scaling,
// periodic validation, a progress line on rank 0 and per-step metrics JSONL.
//
// Global batch order: step s, micro-step m, rank r and row i read the window at position
// s*G + m*(micro*world) + r*micro + i of the seeded epoch order (G = the global batch), so the
// same global batch is seen whatever the world size, for the same global batch size.
//
// Checkpoints (runtime/loop_checkpoints.h): with checkpoint.save_every = N, every N steps and after
// the last step the ranks save <checkpoint.dir>/step-<step>.h5 together; cfg.resume ("latest" or a
// file) continues from one, bit for bit in fp32 at the same world size and stage.
#pragma once
#include <memory>

#include "comm/bootstrap.h"
#include "core/error.h"
#include "runtime/train_config.h"

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

// Trains on the ranks of `group` (default: the world). With `return_params`, every rank gets the
// final fp32 master weights (tests; small models only).
TrainResult train(const TrainConfig& cfg, comm::Runtime& rt, MPI_Comm group = MPI_COMM_NULL,
                  bool return_params = false);

}  // namespace zp::runtime
