// The training driver of `zeropipe train`, one for every model family: data-parallel over the ranks
// of the run's topology (gradients averaged over the data group after the last micro-step),
// gradient accumulation, global-norm clipping, AdamW with a warmup/decay schedule, bf16/fp16/fp32
// compute with fp32 master weights, fp16 dynamic loss scaling, periodic validation, a progress line
// on rank 0 and per-step metrics JSONL. The family (runtime/training_task.h) brings its data, model
// and objective.
//
// Global batch order: step s, micro-step m, data rank r and row i read the sample at position
// s*G + m*(micro*world) + r*micro + i of the seeded epoch order (G = the global batch), so the
// same global batch is seen whatever the world size, for the same global batch size.
//
// Checkpoints (runtime/loop_checkpoints.h): with checkpoint.save_every = N, every N steps and after
// the last step the ranks save <checkpoint.dir>/step-<step>.h5 together; cfg.resume ("latest" or a
// file) continues from one, bit for bit in fp32 at the same world size and stage.
#pragma once
#include <mpi.h>

#include <functional>
#include <memory>

#include "comm/bootstrap.h"
#include "runtime/train_config.h"
#include "runtime/train_result.h"
#include "runtime/training_place.h"
#include "runtime/training_task.h"

namespace zp::runtime {

// Makes the family's task for a placed run (device, stream, global batch) from the configuration as
// resolved for the place (which outlives the task).
using TrainingTaskFactory = std::function<std::unique_ptr<TrainingTask>(const TrainConfig&, const TrainingPlace&)>;

// Trains on the ranks of `group` (MPI_COMM_NULL: the world). With `return_params`, every rank gets
// the final fp32 master weights (tests; small models only).
TrainResult run_training(const TrainConfig& cfg, comm::Runtime& rt, MPI_Comm group, bool return_params,
                         const TrainingTaskFactory& make_task);

}  // namespace zp::runtime
