// ZeRO data parallelism over sharding units (DESIGN decision 2). Every parameter block is padded so
// that each of the N ranks of the data group owns a contiguous, aligned 1/N slice of it.
//   stage 0: every rank holds everything; each block's gradients are all-reduced as soon as its
//            backward of the last micro-step completes (the block is the bucket), overlapping the
//            backward of the blocks before it; earlier micro-steps accumulate locally.
//   stage 1: fp32 master weights and AdamW moments exist only for the owned slice; gradients are
//            all-reduced as in stage 0; each rank updates its slice and the compute weights are
//            all-gathered.
//   stage 2: as 1, and a block's full-size gradient buffer exists only while its backward runs: when
//            the block's gradients are complete they are reduce-scattered into the owner's fp32
//            slice (accumulated over micro-steps) and the buffer is freed.
//   stage 3: as 2, and the compute weights are sharded too: a block is all-gathered into a
//            temporary full buffer when the model acquires it (forward and backward) and freed when
//            the model releases it. The next block's gather is issued as soon as the current one is
//            acquired (the order is the previous step's), so it overlaps the current block's
//            compute; a prefetch is dropped when the weights change.
// The model reports block use through nn::BlockAccess; this engine implements it by composing a
// ParameterGatherer (stage 3's gathers and prefetches, usable alone), a GradientReducer (all-reduce or
// reduce-scatter, and the hand-off to the optimizer stepping in the backward) and a ShardedAdamW
// whose state sits in an OptimizerStateStore on the tier the ShardingPolicy names.
// On GPUs every collective of the engine runs on one communication stream (overlap_comm, the
// default), ordered against the compute stream by events: the compute stream never waits for a
// gradient reduction until the optimizer needs it, and NCCL sees one stream per communicator. A
// gradient buffer whose reduction is in flight is freed on the communication stream.
// With optimizer.step_in_backward (stages 2 and 3), the last micro-step also runs AdamW on each
// block's slice right after its reduce-scatter, so no step-long fp32 gradient exists at all (the
// price: no clipping by the global norm, which is only known after the last block).
// With zero_optimization.offload_optimizer.delayed_update (policy.delays_update()) step() starts the
// CPU update on a host thread and returns; the next step computes with the weights of the update
// before (parallel/delayed_update.h says exactly which; a step skipped for an fp16 overflow calls
// skip_step(), which still installs the previous update's weights). Everything that reads or writes
// the optimizer state (gather_master, visit_state, the next step, the destructor) waits for it first.
// Averaging over the data group makes the result independent of the world size for the same
// global batch: the trajectories of stages 0-3 at any world size agree to rounding.
// A frozen block (nn::ParamBlock::freeze, a LoRA run's base) is placed like any other (replicated, or
// sharded and gathered at stage 3, on the parameter tier) but has no gradients, master weights or
// optimizer state: blocks(), the optimizer, the checkpoints' visit and gather_master() cover the
// blocks that train.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "nn/block_access.h"
#include "parallel/collective_stream.h"
#include "parallel/delayed_update.h"
#include "parallel/engine_state.h"
#include "parallel/gradient_reducer.h"
#include "parallel/memory_plan.h"
#include "parallel/parameter_gatherer.h"
#include "parallel/sharded_adamw.h"
#include "parallel/sharding_policy.h"

namespace zp::parallel {

// The padding every block needs: its flat size must be a multiple of this.
int64_t shard_pad_multiple(int world);

class ZeroEngine : public nn::BlockAccess {
 public:
  // `dp` may be nullptr for a single rank. The blocks must be allocated (full values bound and
  // initialised or loaded) with a pad multiple of shard_pad_multiple(world). With sharded parameters
  // only the owned slice of the values is kept after this constructor. A policy asking for a tier
  // that is not implemented is refused (zp::Error naming the configuration key) before anything is
  // allocated. Tests and benchmarks pass ShardingPolicy::zero_stage(n).
  ZeroEngine(std::vector<nn::ParamBlock*> blocks, const ShardingPolicy& policy, comm::Communicator* dp,
             const AdamWHyper& h, StreamHandle s = nullptr);
  // Blocks that are only laid out (ParamBlock::layout): the engine allocates what the policy keeps and,
  // one block at a time, binds a full zeroed value buffer, lets `fill` initialise or load it, and
  // keeps its slice. Peak memory during start-up is the rank's shard plus one block (stage 3), or the
  // replicated values and (stages 0/1) gradients the stage needs anyway.
  using BlockFill = std::function<void(nn::ParamBlock&)>;
  ZeroEngine(std::vector<nn::ParamBlock*> blocks, const ShardingPolicy& policy, comm::Communicator* dp,
             const AdamWHyper& h, StreamHandle s, const BlockFill& fill);
  ~ZeroEngine() override;

  const ShardingPolicy& policy() const { return policy_; }
  int stage() const { return policy_.stage(); }
  int world() const { return world_; }
  int rank() const { return rank_; }
  const std::vector<nn::ParamBlock*>& blocks() const { return blocks_; }  // those that train

  // Before the first micro-step of a step: clears the gradient accumulators.
  void begin_step();
  // Before each micro-step's backward: `last` = this backward completes the step's gradients, so
  // stages 0/1 reduce each block as it completes (earlier micro-steps only accumulate). Without
  // this call every backward reduces (correct, but it communicates on every micro-step).
  void begin_micro_step(bool last);
  // optimizer.step_in_backward: before the last micro-step's backward, the update that each block
  // gets as soon as its gradients are reduced (grad_scale multiplies the gradients, and `sched` sets
  // the schedule's values, as in step()).
  void set_update_in_backward(float grad_scale, const ScheduledHyper& sched = {});
  bool updates_in_backward() const { return hyper_.step_in_backward; }
  // After the last micro-step: the gradients (or, stepping in the backward, the updates) of every
  // block are complete and visible to the compute stream; stages 0/1 reduce any block the
  // backward did not report.
  void finish_gradients();
  // Squared global L2 norm of the averaged gradients (identical on every rank); inf/nan when a
  // gradient is not finite. Stepping in the backward: of the gradients those updates used.
  // `excluded`: a block left out (a pipeline stage's replica of a tied embedding, which the first
  // stage counts).
  double grad_norm_squared(const nn::ParamBlock* excluded = nullptr);
  // Pipeline stages sharing a block (a tied embedding on the first and last stage): after
  // finish_gradients, adds the other members' gradients of block `b` into this rank's, so every
  // copy takes the same update. `c` joins the ranks holding the copies (same data coordinate).
  void sum_gradients_over(const nn::ParamBlock& b, comm::Communicator& c);
  // AdamW on the owned slices; then stages 1/2 all-gather the new compute weights. Not with
  // step_in_backward (the backward has updated every block). With the delayed update: installs the
  // previous update's weights (all-gathered where replicated) and starts this one in the background.
  // `sched`: the learning rate (and betas) the schedule gives this update; unset, the configured ones.
  void step(float grad_scale, const ScheduledHyper& sched = {});
  // A step that takes no update (an fp16 overflow: finish_step's scaler decided, alike on every
  // rank): the optimizer's state and step count stay. With the delayed update the previous update's
  // weights are still installed (all-gathered where replicated), as step() would, and none starts.
  void skip_step();
  bool delays_update() const { return delayed_ != nullptr; }
  int64_t optimizer_steps() const { return opt_->steps(); }
  // A loaded checkpoint's count (bias correction and the LR schedule follow it).
  void set_optimizer_steps(int64_t n) { opt_->set_steps(n); }
  MemoryPlan memory_plan() const;
  // Every block's fp32 master weights (its parameters in order, without the padding, which depends
  // on the world size; blocks in order), gathered from the owners onto every rank: for tests and
  // small-model tools, not for large models.
  std::vector<float> gather_master();
  // Visits every block's optimizer state (runtime/checkpoint.h saves and loads through this); the
  // visitor's copies are ordered on `s`. When the visitor wrote master weights, the compute weights
  // are rewritten from them afterwards (cast to the compute dtype, then all-gathered where they are
  // replicated), so the next forward sees the loaded values. With the delayed update the visit
  // follows the update in flight (the state after every update started), the blocks offer their
  // lagging compute weights (BlockState::has_lagging_weights), and where the visitor wrote those
  // too they stay the compute weights and the loaded master weights wait for the next step().
  void visit_state(const EngineStateVisitor& visit, StreamHandle s = nullptr);

  // overlap_comm = false runs every collective on the compute stream (for measuring the overlap).
  void set_overlap_comm(bool on);
  // Communication time: with timing on, every collective is bracketed by CUDA events on the stream
  // it runs on (or timed on the host for MPI); comm_times() returns the busy time per collective
  // kind and the time compute waited for communication since its last call, comm_ms() the busy
  // total. With overlap the busy time is the communication stream's, mostly hidden behind compute.
  void set_timing(bool on) { comm_.set_timing(on); }
  CommTimes comm_times() { return comm_.take(); }
  double comm_ms() { return comm_.take_ms(); }

  // nn::BlockAccess
  void acquire_params(nn::ParamBlock& b) override;
  void release_params(nn::ParamBlock& b) override;
  void acquire_grads(nn::ParamBlock& b) override;
  void release_grads(nn::ParamBlock& b) override;

 private:
  // Where block i's updated weights go: its ZeRO-3 shard in memory, or its owned range of the full
  // values (not for shards on NVMe, which take new weights through write_new_weights only).
  void* weights_out(size_t i) const;
  // Gives `write(group, outs)` where the new weights of trained blocks `trained` go (outs[j] for
  // group[j]), ordered on `s`: all at once, except that shards on NVMe come in groups that fit the
  // tier's buffers, each written to the swap file after `write` returns (ParameterGatherer::rewrite_shards).
  using NewWeights = std::function<void(std::span<const size_t> group, std::span<void* const> outs)>;
  void write_new_weights(std::span<const size_t> trained, StreamHandle s, const NewWeights& write);
  void update_in_backward(size_t i, const Tensor& grad, StreamHandle cs);
  void refresh_compute_weights();
  // The delayed update's arguments: every range's gradients and weights into updates_, and the ZeRO-3
  // shards it may exchange with its spares.
  std::vector<Tensor*> delayed_ranges();
  size_t index_of(const nn::ParamBlock& b) const;
  void all_gather_compute_weights();
  // Where weights_out() points: the blocks' device, or host memory for the parameter tier's shards.
  Device weights_device() const;
  class LaggingAccess;

  ShardingPolicy policy_;
  int world_ = 1, rank_ = 0;
  comm::Communicator* dp_;
  StreamHandle s_;
  AdamWHyper hyper_;
  std::vector<nn::ParamBlock*> all_blocks_;  // as given, frozen ones included
  std::vector<nn::ParamBlock*> blocks_;      // those that train: block i of the reducer and optimizer
  std::vector<size_t> gathered_index_;       // stage 3: trained block i's index in the gatherer
  std::vector<size_t> trained_;              // 0, 1, ..., blocks_.size() - 1
  CollectiveStream comm_;  // declared before what frees buffers on its stream
  std::unique_ptr<ParameterGatherer> gatherer_;  // with sharded parameters
  std::unique_ptr<GradientReducer> reducer_;
  std::unique_ptr<ShardedAdamW> opt_;
  std::unique_ptr<DelayedUpdate> delayed_;       // with policy.delays_update(); uses opt_
  std::unique_ptr<LaggingWeights> lagging_;      // the checkpoints' view of the compute weights then
  std::vector<RangeUpdate> updates_;       // reused: step()'s argument list
  float update_scale_ = 1.f;               // step_in_backward: this step's update
  ScheduledHyper update_sched_;
  Tensor update_norms_;                    // step_in_backward: squared norm of each block's gradient
};

}  // namespace zp::parallel
