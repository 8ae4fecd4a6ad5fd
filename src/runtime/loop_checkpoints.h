// The checkpoints of a training run, the same for every model family (runtime/training_driver.h):
// before the first step, `--resume` ("latest" or a file) restores the engine's weights and moments,
// the optimizer step (bias correction, LR schedule), the fp16 loss scaler and the data position;
// after every checkpoint.save_every steps, after the last one (whenever checkpoint.dir is set) and
// when a signal stops the run, the ranks save <checkpoint.dir>/step-<step>.h5 together
// (runtime/checkpoint.h) and keep the newest checkpoint.keep_last. An fp32 run resumed at the same
// world size and ZeRO stage reproduces the uninterrupted run bit for bit; another world size or
// stage continues to rounding (the reduction order changes). The data position moves by one global
// batch per step from the saved one.
//
// Nothing lost: checkpoint.dir is checked before the first step (creatable, a directory, writable,
// room for keep_last + 1 checkpoints of this model); a checkpoint is only written from a healthy
// step (finite loss and gradient norm; a due save waits for the next healthy step), so rotation never
// replaces good checkpoints with diverged ones; `--resume latest` verifies what it loads and skips a
// damaged newest checkpoint (renamed <name>.damaged, out of the rotation) for the newest intact one.
//
// Asynchronous saves (checkpoint.async = true): a periodic save copies this rank's state into host
// memory (pinned; kept between saves: host RAM of the rank's share of the checkpoint, which start-up
// checks against what the node's ranks have available) and writes the file's structure, then a thread
// writes the data while the steps go on (runtime/checkpoint.h). After each step the ranks agree
// whether every thread is done (one small all-reduce while a save is in flight); then the file is
// committed (renamed into place) and only then does rotation delete older ones. The next save, the
// last step and a stop signal first wait for the save in flight; the last step's and a signal's saves
// are written at once. A failed background save (a full disk, an I/O error) is logged by the rank that
// saw it at once and stops the run with that error, on every rank, when the ranks next agree: the
// temporary file is removed and the checkpoints already committed stay. A run that ends by an error
// abandons a save in flight (its temporary file is removed).
#pragma once
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "parallel/zero_engine.h"
#include "runtime/checkpoint.h"
#include "runtime/loss_scaler.h"
#include "runtime/train_config.h"
#include "runtime/train_result.h"

namespace zp::runtime {

class LoopCheckpoints {
 public:
  // `model` names the model in every file written and is what a resumed file must match. `group`:
  // every rank of the run; `stages`: a pipelined run's part of the model (runtime/checkpoint.h).
  LoopCheckpoints(const TrainConfig& cfg, MPI_Comm group, parallel::ZeroEngine& engine, CheckpointModel model,
                  int64_t global_batch, StreamHandle s, std::optional<StageBlocks> stages = std::nullopt);

  // Before the first step: with cfg.resume naming a checkpoint, loads it into the engine, rebuilds
  // `scaler` and records the resume in `result` (first_step, resumed_from). Collective over the group.
  void resume(LossScaler& scaler, TrainResult& result);
  int64_t start_step() const { return start_step_; }
  // Global position, in the seeded sample order, of the first sample that step `step` (0-based) reads.
  int64_t first_sample(int64_t step) const { return data_position_ + (step - start_step_) * global_batch_; }

  // After step `steps_done` (1-based) of cfg.max_steps: saves when one is due (or `stop`: a signal
  // ends the run), adding the file to result.saved, unless the step was not `healthy`. Collective.
  void step_done(int64_t steps_done, bool healthy, bool stop, const LossScaler& scaler, TrainResult& result);
  // The last save: its wall seconds and the file's bytes (for the metrics' checkpoint events).
  struct SaveTiming {
    double seconds = 0;
    int64_t bytes = 0;
  };
  // With checkpoint.async: the file appears in result.saved when committed, a few steps after its
  // step, and the seconds are those from the save point to the commit.
  const SaveTiming& last_save() const { return last_save_; }
  // The resume's load (zero when the run started fresh): its wall seconds, checks included, and the
  // file's bytes.
  const SaveTiming& load_timing() const { return load_; }
  // Steps skipped for an fp16 overflow over the whole training, those before the resume included.
  int64_t skipped_steps(const LossScaler& scaler) const { return skipped_before_ + scaler.skipped(); }

 private:
  SaveTiming load_;
  LossScalerState scaler_state(const LossScaler& sc) const;
  const StageBlocks* stage_blocks() const { return stages_ ? &*stages_ : nullptr; }
  void save(int64_t steps_done, const LossScaler& scaler, TrainResult& result, bool async);
  // checkpoint.dir exists or can be created, is a writable directory and has room; rank 0 decides.
  void check_storage() const;
  // checkpoint.async: the snapshot fits in host memory beside what the node's other ranks take.
  void check_snapshot_memory();
  // The asynchronous save in flight, committed when every rank's thread is done (or at once with
  // `wait`), then rotated. Collective.
  void finish_pending(bool wait, TrainResult& result);
  // After `path` is in place: rotation, result.saved, last_save() (from `since`) and the log line.
  void committed(const std::string& path, std::chrono::steady_clock::time_point since, const char* how,
                 TrainResult& result);

  const TrainConfig& cfg_;
  MPI_Comm group_;
  parallel::ZeroEngine& engine_;
  CheckpointModel model_;
  int64_t global_batch_;
  StreamHandle s_;
  std::optional<StageBlocks> stages_;
  int64_t start_step_ = 0, data_position_ = 0;  // where this run starts
  int64_t bytes_per_checkpoint_;
  int64_t skipped_before_ = 0;                  // skips before this run
  bool save_pending_ = false;
  SaveTiming last_save_;                   // a due save waits for a healthy step
  // checkpoint.async: the save in flight, when it started, and the host copy it writes from.
  std::unique_ptr<io::CheckpointWriter> in_flight_;
  std::chrono::steady_clock::time_point in_flight_since_;
  std::vector<Tensor> snapshot_;
};

}  // namespace zp::runtime
