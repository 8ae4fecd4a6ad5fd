// Training of the transformer LMs (`zeropipe train` with model.type "transformer"; models/
// transformer.h) on token files (io/token_dataset.h): next-token cross-entropy over windows of
// data.seq_len tokens, under the training driver (runtime/training_driver.h), which does everything
// that is not the LM's data, model or objective.
#pragma once
#include <mpi.h>

#include "comm/bootstrap.h"
#include "runtime/train_config.h"
#include "runtime/train_result.h"

namespace zp::runtime {

// Trains on the ranks of `group` (default: the world). With `return_params`, every rank gets the
// final fp32 master weights (tests; small models only).
TrainResult train(const TrainConfig& cfg, comm::Runtime& rt, MPI_Comm group = MPI_COMM_NULL,
                  bool return_params = false);

}  // namespace zp::runtime
