// A pipelined training step (issue 12): this rank is one stage of P; it runs its schedule's passes
// (parallel/pipeline_schedule.h) over the step's M micro-batches, receiving each chunk's input from
// the stage before and its output gradient from the stage after through the StageLink, and tells the
// ZeRO engine which backward completes each chunk's gradients (stages 0/1 reduce them then; with
// ZB-H1's split backward, which weight pass, the chunk's last W of the step). The
// update itself is the driver's (runtime/optimizer_step.h finish_step with PipelineGradients).
//
// Receives are posted one pass ahead, so over MPI a message's transfer overlaps the pass before the
// one that needs it (the NCCL link enqueues a receive only when its pass needs it: comm/stage_link.h);
// sends never wait.
//
// Messages carry tag micro * C + the global chunk that receives them (C = P x V chunks), unique per
// channel within a step; validation runs its micro-batches in groups that keep tags in range.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/stage_link.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/zero_engine.h"

namespace zp::runtime {

// What a model family brings to a pipelined step: the forward and backward of its local model
// chunks, one micro-batch at a time. The family keeps each (micro, chunk)'s activations from the
// forward to the backward, and the last chunk's objective.
class PipelineStageModel {
 public:
  virtual ~PipelineStageModel() = default;
  // A fresh buffer of the tensor that enters global chunk `chunk` (0 < chunk < P x V) from the chunk
  // before it for one micro-batch, which is also the size of its gradient going back across that cut
  // (receives land in it). Its size may differ from cut to cut (the UNet's skip activations).
  virtual Tensor boundary_buffer(int chunk) = 0;
  // Local chunk `chunk`'s forward of the micro-batch at global sample `first` (`step` keys any
  // per-step draws): `input` is the previous chunk's output, empty for the model's first chunk (which
  // reads the batch). Returns the output for the next chunk; the model's last chunk applies the
  // objective (its gradient scaled by `loss_scale` when training) and returns an empty tensor.
  // `train` = false keeps nothing for a backward.
  virtual Tensor forward(int chunk, int micro, int64_t step, int64_t first, Tensor input, bool train,
                         float loss_scale) = 0;
  // The backward of (micro, chunk): `output_grad` is the next chunk's input gradient (empty for the
  // model's last chunk: the objective's). Returns this chunk's input gradient (empty for the model's
  // first chunk).
  virtual Tensor backward(int chunk, int micro, Tensor output_grad) = 0;
  // ZB-H1 (parallel/pipeline_schedule.h): the backward split in two. backward_input is backward()
  // computing only what the stage before waits for (and whatever the family keeps there: see its
  // comments), leaving the weight gradients in (micro, chunk)'s state; backward_weight computes them
  // later. A family that cannot split says so (the defaults throw zp::Error naming
  // pipeline.schedule).
  virtual Tensor backward_input(int chunk, int micro, Tensor output_grad);
  virtual void backward_weight(int chunk, int micro);
  // The model's last chunk: micro-batch `micro`'s mean loss (read after its backward is queued).
  virtual double loss(int micro) = 0;

  // A block held by two stages (a tied embedding: the first stage's, and the last stage's replica
  // for the head), whose gradients the update sums (runtime/optimizer_step.h PipelineGradients).
  struct SharedBlock {
    const nn::ParamBlock* block = nullptr;  // this stage's copy, if it holds one
    bool replica = false;                   // the copy another stage's norm and checkpoint count
  };
  // Where block `b` sits in the whole model: blocks sorted by it are in the whole model's order.
  virtual int64_t model_position(const nn::ParamBlock& b) const = 0;
  // Whether the model has such a block (the same answer on every rank).
  virtual bool has_shared_blocks() const = 0;
  virtual SharedBlock shared_block() = 0;
};

// What the stage's last training step spent: `span` seconds from its first pass's start to its last
// pass's end, `busy` of them computing passes (on a GPU measured by events around each pass on the
// compute stream, on the CPU on the host), and `waiting` blocked on the link (MPI; 0 on NCCL, where
// the device waits). The stage's bubble is its idle share of the step's window (the longest span of
// the pipeline's stages): 1 - busy / window, transfers not hidden included.
// `link_busy`: seconds the link was busy sending and receiving (comm::StageLink::take_busy_ms), the
// step-time breakdown's "send_recv" communication.
// Inside the span, the device's idle time between passes (GPUs; 0 on the CPU) splits into
// `recv_gaps`, before passes that consumed a receive (the peer's compute the schedule waits for, and
// the transfer's latency, which the theory does not count), and `other_gaps`, before passes that
// needed nothing (the host launching late). What is left of the idle time is outside the span: the
// wait for the first input and after the last pass.
struct StageTimes {
  double busy = 0, span = 0, waiting = 0, link_busy = 0;
  double recv_gaps = 0, other_gaps = 0;
  double bubble_in(double window) const { return window > 0 ? 1.0 - busy / window : 0.0; }
};

class PipelineStep {
 public:
  // `s`: the compute stream (GPUs; null on the CPU), for timing the passes.
  PipelineStep(parallel::PipelineScheduleKind kind, parallel::PipelineShape shape, int stage, comm::StageLink& link,
               parallel::ZeroEngine& engine, PipelineStageModel& model, StreamHandle s = nullptr);
  // The bubble of this schedule in theory (parallel/pipeline_schedule.h): (P - 1) / (V M + P - 1), ZB-H1
  // (P - 1) / (3 M + P - 1).
  double theoretical_bubble() const { return parallel::theoretical_bubble(kind_, shape_); }

  const parallel::PipelineShape& shape() const { return shape_; }
  int stage() const { return stage_; }
  bool last_stage() const { return stage_ + 1 == shape_.stages; }

  // Runs the step's passes; firsts[m] is micro-batch m's first global sample. Returns the mean loss
  // over the micro-batches on the last stage, 0 on the others.
  double train(int64_t step, const std::vector<int64_t>& firsts, float loss_scale);
  // Forward passes only; the mean loss over `firsts` on the last stage, 0 on the others. Leaves
  // last_times() the training step's.
  double validate(const std::vector<int64_t>& firsts);
  // Of the last train() (waits for its passes to finish on a GPU).
  StageTimes last_times();

 private:
  // Runs `passes` over micro-batches whose first samples are `firsts`; returns the loss sum.
  double run(const std::vector<parallel::PipeAction>& passes, int64_t step, const std::vector<int64_t>& firsts,
             bool train, float loss_scale);

  parallel::PipelineScheduleKind kind_;
  parallel::PipelineShape shape_;
  int stage_;
  comm::StageLink& link_;
  parallel::ZeroEngine& engine_;
  PipelineStageModel& model_;
  std::vector<parallel::PipeAction> train_passes_;
  StreamHandle s_;
  std::vector<std::unique_ptr<Event>> pass_events_;  // GPUs: a start and an end per training pass
  std::vector<char> received_;                       // per training pass: whether it consumed a receive
  bool timed_ = false;    // the last run() recorded pass_events_
  StageTimes times_;
};

}  // namespace zp::runtime
