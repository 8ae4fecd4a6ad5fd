// What every training loop shares (runtime/trainer.h for LMs, runtime/diffusion.h for UNets): where
// it runs and its communicators, and the step loop: per step, the micro-steps of gradient accumulation (the engine told which one completes
// the step), the optimizer (finish_step), the loss averaged over the data group, validation every
// training.eval_every steps and after the last, the progress report and the checkpoints. The model
// side comes in as two callbacks, so each loop keeps its own batches and objective.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "comm/mpi_comm.h"
#include "parallel/zero_engine.h"
#include "runtime/loop_checkpoints.h"
#include "runtime/loss_scaler.h"
#include "runtime/lr_schedule.h"
#include "runtime/step_report.h"
#include "runtime/train_config.h"
#include "runtime/trainer.h"

namespace zp::runtime {

// Where a training loop runs: its data group (`group`; MPI_COMM_NULL becomes the whole world), the
// group's size and this rank, the device training.device picks, and the global batch, checked
// against train_batch_size. Throws zp::Error naming the key.
struct LoopPlace {
  int world = 1, rank = 0;
  Device dev;
  int64_t global_batch = 0;
};
LoopPlace place_loop(const TrainConfig& cfg, comm::Runtime& rt, MPI_Comm& group);

// The loop's communicators over its group (none for a single rank): tensors on the device's backend
// (NCCL on GPUs, MPI on CPUs), host scalars such as losses over MPI.
struct LoopComms {
  std::unique_ptr<comm::Communicator> dp;
  std::unique_ptr<comm::MpiComm> ctrl;
};
LoopComms make_loop_comms(const LoopPlace& at, MPI_Comm group);

struct StepLoop {
  const TrainConfig& cfg;
  parallel::ZeroEngine& engine;
  LossScaler& scaler;
  const LrSchedule& schedule;
  LoopCheckpoints& checkpoints;
  StepReporter& reporter;
  comm::Communicator* ctrl;  // host scalars over the data group; nullptr for a single rank
  int rank, world;
  StreamHandle s;
};

// Position `first` is a global index into the sample order. train(step, first, loss_scale) runs one
// training micro-batch's forward and backward and returns its loss (read after the backward is
// queued); validate(first) runs a validation forward and returns its loss, and is empty without
// validation data. Fills result.losses, result.val_losses, result.saved and result.skipped_steps.
void run_steps(const StepLoop& loop, const std::function<double(int64_t step, int64_t first, float loss_scale)>& train,
               const std::function<double(int64_t first)>& validate, TrainResult& result);

}  // namespace zp::runtime
