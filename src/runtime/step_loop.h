// The step loop of the training driver (runtime/training_driver.h): per step, the micro-steps of
// gradient accumulation (the engine told which one completes the step; a pipeline stage's schedule
// runs them instead), the optimizer (finish_step), the loss averaged over the data group (of the
// last pipeline stage, the one that computes it), the same on every rank, validation every training.eval_every steps and after the
// last, the progress report and the checkpoints. The model side comes in as two callbacks, the
// family's (runtime/training_task.h) batches and objective.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>

#include "comm/communicator.h"
#include "parallel/zero_engine.h"
#include "runtime/loop_checkpoints.h"
#include "runtime/loss_scaler.h"
#include "runtime/lr_schedule.h"
#include "runtime/optimizer_step.h"
#include "runtime/pipeline_step.h"
#include "runtime/step_report.h"
#include "runtime/train_config.h"
#include "runtime/train_result.h"

namespace zp::runtime {

struct StepLoop {
  const TrainConfig& cfg;
  parallel::ZeroEngine& engine;
  LossScaler& scaler;
  const LrSchedule& schedule;
  LoopCheckpoints& checkpoints;
  StepReporter& reporter;
  comm::Communicator* ctrl;  // host scalars over all of the run's ranks; nullptr for a single rank
  int data_rank, data_size;  // which samples this rank reads
  StreamHandle s;
  // A pipelined run (issue 12): the stage's schedule runs each step's micro-batches, and the update
  // takes the stages' gradients together; only the last stage computes losses.
  PipelineStep* pipeline = nullptr;
  const PipelineGradients* pipeline_grads = nullptr;
  // Host seconds spent reading training batches since the last call (TrainingTask::take_data_seconds).
  std::function<double()> data_seconds;
  // Milliseconds of the training forwards since the last call (TrainingTask::take_forward_ms); empty:
  // the breakdown has no forward/backward split.
  std::function<double()> forward_ms;
  // Called before each step's micro-batches with the step's global batch, samples [first, first +
  // samples) (TrainingTask::begin_step); what it returns goes to StepReporter::set_step_items.
  std::function<std::optional<int64_t>(int64_t first, int64_t samples)> begin_step;
};

// Position `first` is a global index into the sample order. train(step, first, loss_scale) runs one
// training micro-batch's forward and backward and returns its loss (read after the backward is
// queued); validate(first) runs a validation forward and returns its loss, and is empty without
// validation data. Fills result.losses, result.val_losses, result.saved and result.skipped_steps.
void run_steps(const StepLoop& loop, const std::function<double(int64_t step, int64_t first, float loss_scale)>& train,
               const std::function<double(int64_t first)>& validate, TrainResult& result);

}  // namespace zp::runtime
