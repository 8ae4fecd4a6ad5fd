// Training of the transformer LMs (`zeropipe train` with model.type "transformer"; models/
// transformer.h) on token files (io/token_dataset.h): next-token cross-entropy over windows of
// data.seq_len tokens, under the training driver (runtime/training_driver.h), which does everything
// that is not the LM's data, model or objective.
#pragma once
#include <mpi.h>

#include <memory>

#include "comm/bootstrap.h"
#include "runtime/train_config.h"
#include "runtime/train_result.h"
#include "runtime/training_place.h"
#include "runtime/training_task.h"

namespace zp::runtime {

// Trains on the ranks of `group` (default: the world). With `return_params`, every rank gets the
// final fp32 master weights (tests; small models only).
TrainResult train(const TrainConfig& cfg, comm::Runtime& rt, MPI_Comm group = MPI_COMM_NULL,
                  bool return_params = false);

// The LM's task for the training driver (run_training): for callers that wrap it (tests that watch
// or steer the loop from inside a task).
std::unique_ptr<TrainingTask> make_lm_task(const TrainConfig& cfg, const TrainingPlace& at);

}  // namespace zp::runtime
