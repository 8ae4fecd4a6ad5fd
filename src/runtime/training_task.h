// What a model family brings to the training driver (runtime/training_driver.h): its data, its model
// and its objective. Everything else (topology, devices, communicators, ZeRO engine, optimizer,
// schedule, loss scaling, checkpoints, progress and metrics) is the driver's, the same for every
// family. The LM (runtime/lm_training.h) and the diffusion UNet (runtime/diffusion_training.h) are
// the two families today.
//
// The driver makes the task once the run is placed; the task's constructor reads the model's config
// and opens and checks its data, so a bad file is reported before any communicator or model memory
// exists. Then, in order: lay_out_model, fill_block for every block (inside the engine's
// constructor), set_block_access, checkpoint_model, progress, describe, and begin_step, micro_step /
// validation_loss for the rest of the run.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "nn/block_access.h"
#include "nn/parameter.h"
#include "runtime/checkpoint.h"
#include "runtime/pipeline_step.h"

namespace zp::runtime {

// What a step processes, for the progress line, the metrics and MFU.
struct ProgressUnit {
  std::string unit;             // "tok" | "samples"
  int64_t items_per_sample = 1;  // one sample's items: its tokens, or 1
  double flops_per_item = 0;    // one item's training FLOPs (forward and backward)
};

class TrainingTask {
 public:
  virtual ~TrainingTask() = default;

  // The model laid out but not allocated (the ZeRO engine allocates and fills one block at a time,
  // so no rank ever holds the whole model), every block's flat size padded to a multiple of
  // `pad_multiple`; with model.init "hub", the hub's weights opened (and checked against the model).
  virtual std::vector<nn::ParamBlock*> lay_out_model(int64_t pad_multiple) = 0;
  // Gives freshly allocated block `b` its initial values: the hub's, or random ones.
  virtual void fill_block(nn::ParamBlock& b) = 0;
  // From now on the model reports every use of a block to `access` (the engine).
  virtual void set_block_access(nn::BlockAccess* access) = 0;

  // Names the model in every checkpoint written; a resumed checkpoint must match it.
  virtual CheckpointModel checkpoint_model() const = 0;
  virtual ProgressUnit progress() = 0;
  // An estimate of the activation bytes training keeps (after lay_out_model), for the start-up fit
  // check (models/activation_estimate.h): one micro-batch's, or in a pipeline stage the most its
  // schedule keeps in flight (runtime/pipeline_chunks.h, as `zeropipe plan` counts them).
  virtual double activation_bytes() = 0;
  // The start-up line: the model, where it runs, precision, batch and data.
  virtual std::string describe() = 0;

  // Before a training step's micro-batches, on every rank: the step's global batch is the samples
  // at global positions [first, first + samples) (every data rank's micro-batches of the step). A
  // family whose loss averages over a number of items that varies from sample to sample (instruction
  // data's trained tokens) counts them here, so that each micro-batch's loss and gradient are divided
  // by the step's count (as Hugging Face's num_items_in_batch) and the step's result does not depend
  // on how the global batch is cut into micro-batches and ranks. Returns the items the step really
  // processes where some of its samples' items are padding (instruction rows' padding tokens), for
  // throughput and MFU; none: every item is real.
  // Every family says (a wrapper must pass it on: the step's micro-batches depend on it).
  virtual std::optional<int64_t> begin_step(int64_t first, int64_t samples) = 0;
  // One training micro-batch: the samples at global positions [first, first + micro) of the seeded
  // sample order (`step` keys any per-step draws), forward, objective, backward of the loss scaled by
  // `loss_scale`. Returns the micro-batch's loss, read after the backward is queued so the device
  // never waits for the host: its mean, or with begin_step's counts its items' summed loss over the
  // step's average count per micro-batch (so that the mean over the step's micro-batches and ranks
  // is the step's mean over all its items).
  virtual double micro_step(int64_t step, int64_t first, float loss_scale) = 0;
  // Whether there is validation data; validation_loss(first) is the mean loss of the validation
  // micro-batch at `first` (forward and objective only).
  virtual bool has_validation() const = 0;
  virtual double validation_loss(int64_t first) = 0;

  // A family that can run as pipeline stages (issue 12) returns its stage's chunks; nullptr: the
  // family cannot (pipeline.stages > 1 is refused for it).
  virtual PipelineStageModel* pipeline_stage() { return nullptr; }

  // Host seconds spent reading and assembling training batches since the last call: the data part
  // of the step-time breakdown.
  double take_data_seconds() { return std::exchange(data_seconds_, 0.0); }
  // Milliseconds of the training micro-batches' forward passes (objective included) since the last
  // call, bracketed by forward_begins/forward_ends: the forward part of the step-time breakdown (the
  // rest of the forward-and-backward phase is the backward). Call after the compute stream is
  // synchronized. A pipeline stage's schedule does not bracket its forwards: 0.
  double take_forward_ms() {
    double ms = std::exchange(forward_host_ms_, 0.0);
    for (size_t i = 0; i + 1 < forward_events_used_; i += 2)
      ms += forward_events_[i + 1]->elapsed_ms_since(*forward_events_[i]);
    forward_events_used_ = 0;
    return ms;
  }

 protected:
  // Around a training micro-batch's forward and objective, on the compute stream `s`: CUDA events on
  // a GPU, so the time is the device's, not the host's queueing; the host clock on the CPU (s null).
  void forward_begins(StreamHandle s) {
    if (!s) {
      forward_t0_ = std::chrono::steady_clock::now();
      return;
    }
    if (forward_events_.size() < forward_events_used_ + 2) {
      forward_events_.push_back(std::make_unique<Event>());
      forward_events_.push_back(std::make_unique<Event>());
    }
    forward_events_[forward_events_used_]->record(s);
  }
  void forward_ends(StreamHandle s) {
    if (!s) {
      forward_host_ms_ +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - forward_t0_).count();
      return;
    }
    forward_events_[forward_events_used_ + 1]->record(s);
    forward_events_used_ += 2;
  }

  // Runs `read` (which returns a batch), adding its time to the data seconds.
  template <class Read>
  auto timed_read(Read&& read) {
    const auto t0 = std::chrono::steady_clock::now();
    auto batch = read();
    data_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return batch;
  }

 private:
  double data_seconds_ = 0;
  double forward_host_ms_ = 0;
  std::chrono::steady_clock::time_point forward_t0_;
  std::vector<std::unique_ptr<Event>> forward_events_;  // pairs: begin, end
  size_t forward_events_used_ = 0;
};

}  // namespace zp::runtime
