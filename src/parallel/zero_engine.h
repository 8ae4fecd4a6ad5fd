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
// The model reports block use through nn::BlockAccess; this engine implements it.
// On GPUs every collective of the engine runs on one communication stream (overlap_comm, the
// default), ordered against the compute stream by events: the compute stream never waits for a
// gradient reduction until the optimizer needs it, and NCCL sees one stream per communicator. A
// gradient buffer whose reduction is in flight is freed on the communication stream.
// With optimizer.step_in_backward (stages 2 and 3), the last micro-step also runs AdamW on each
// block's slice right after its reduce-scatter, so no step-long fp32 gradient exists at all (the
// price: no clipping by the global norm, which is only known after the last block).
// Averaging over the data group makes the result independent of the world size for the same
// global batch: the trajectories of stages 0-3 at any world size agree to rounding.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "nn/block_access.h"
#include "parallel/sharded_adamw.h"

namespace zp::parallel {

// The padding every block needs: its flat size must be a multiple of this.
int64_t shard_pad_multiple(int world);

struct MemoryPlan {
  int64_t params = 0;             // Ψ: parameters (all blocks, padded)
  double param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;  // per rank, resident
  std::string str(int stage, int world) const;
};

class ZeroEngine : public nn::BlockAccess {
 public:
  // `dp` may be nullptr for a single rank. The blocks must be allocated (full values bound and
  // initialised or loaded) with a pad multiple of shard_pad_multiple(world). Stage 3 keeps only the
  // owned slice of the values after this constructor.
  ZeroEngine(std::vector<nn::ParamBlock*> blocks, int stage, comm::Communicator* dp, const AdamWHyper& h,
             StreamHandle s = nullptr);
  // Blocks that are only laid out (ParamBlock::layout): the engine allocates what the stage keeps and,
  // one block at a time, binds a full zeroed value buffer, lets `fill` initialise or load it, and
  // keeps its slice. Peak memory during start-up is the rank's shard plus one block (stage 3), or the
  // replicated values and (stages 0/1) gradients the stage needs anyway.
  using BlockFill = std::function<void(nn::ParamBlock&)>;
  ZeroEngine(std::vector<nn::ParamBlock*> blocks, int stage, comm::Communicator* dp, const AdamWHyper& h,
             StreamHandle s, const BlockFill& fill);
  ~ZeroEngine() override;

  int stage() const { return stage_; }
  int world() const { return world_; }
  int rank() const { return rank_; }

  // Before the first micro-step of a step: clears the gradient accumulators.
  void begin_step();
  // Before each micro-step's backward: `last` = this backward completes the step's gradients, so
  // stages 0/1 reduce each block as it completes (earlier micro-steps only accumulate). Without
  // this call every backward reduces (correct, but it communicates on every micro-step).
  void begin_micro_step(bool last);
  // optimizer.step_in_backward: before the last micro-step's backward, the update that each block
  // gets as soon as its gradients are reduced (grad_scale multiplies the gradients, as in step()).
  void set_update_in_backward(float grad_scale, double lr);
  bool updates_in_backward() const { return hyper_.step_in_backward; }
  // After the last micro-step: the gradients (or, stepping in the backward, the updates) of every
  // block are complete and visible to the compute stream; stages 0/1 reduce any block the
  // backward did not report.
  void finish_gradients();
  // Squared global L2 norm of the averaged gradients (identical on every rank); inf/nan when a
  // gradient is not finite. Stepping in the backward: of the gradients those updates used.
  double grad_norm_squared();
  // AdamW on the owned slices; then stages 1/2 all-gather the new compute weights. Not with
  // step_in_backward (the backward has updated every block).
  void step(float grad_scale, double lr);
  int64_t optimizer_steps() const { return opt_->steps(); }
  ShardedAdamW& optimizer() { return *opt_; }
  MemoryPlan memory_plan() const;
  // Every block's fp32 master weights (its parameters in order, without the padding, which depends
  // on the world size; blocks in order), gathered from the owners onto every rank: for tests and
  // small-model tools, not for large models.
  std::vector<float> gather_master();
  // After the fp32 master weights of the owned ranges were overwritten (a checkpoint load): rewrites
  // the compute weights from them (cast to the compute dtype, then all-gathered where they are
  // replicated), so the next forward sees the loaded values.
  void refresh_compute_weights();

  // overlap_comm = false runs every collective on the compute stream (for measuring the overlap).
  void set_overlap_comm(bool on);
  // Communication time: with timing on, every collective is bracketed by CUDA events on the stream
  // it runs on (or timed on the host for MPI); comm_ms() returns the total since its last call.
  // With overlap this is time the communication stream is busy, mostly hidden behind compute.
  void set_timing(bool on) { timing_ = on; }
  double comm_ms();

  // nn::BlockAccess
  void acquire_params(nn::ParamBlock& b) override;
  void release_params(nn::ParamBlock& b) override;
  void acquire_grads(nn::ParamBlock& b) override;
  void release_grads(nn::ParamBlock& b) override;

 private:
  struct Unit {
    nn::ParamBlock* block;
    int64_t shard;          // elements per rank
    Tensor values_shard;    // stage 3: the owned slice of the compute weights
    Tensor grad_shard;      // stages 2/3: fp32 accumulator of the owned slice (step_in_backward:
                            // only when micro-steps accumulate)
    int params_refs = 0, grads_refs = 0;
    bool reduced = false;   // stages 0/1: this block's gradients were all-reduced since it last
                            // accumulated (the all-reduce may still be in flight)
    bool updated = false;   // step_in_backward: this step's update has been applied
    Tensor prefetched;                   // stage 3: a full buffer being gathered on the comm stream
    std::shared_ptr<Event> prefetch_done;  // recorded on the comm stream after that gather
  };
  void prefetch(Unit& u);
  void drop_prefetches();
  // Where collectives run, and the two orderings between it and the compute stream.
  StreamHandle comm_stream() const { return comm_stream_ ? comm_stream_->handle() : s_; }
  void comm_after_compute();
  void compute_after_comm();
  void all_reduce_grads(Unit& u);
  void reduce_scatter_grads(Unit& u);
  void update_in_backward(Unit& u, const Tensor& grad, StreamHandle cs);
  Unit& unit(nn::ParamBlock& b);
  std::vector<Unit> units_;
  int stage_, world_ = 1, rank_ = 0;
  comm::Communicator* dp_;
  StreamHandle s_;
  std::unique_ptr<ShardedAdamW> opt_;
  Tensor norm_sq_;
  template <class F> void timed(StreamHandle s, F&& collective);
  bool timing_ = false;
  AdamWHyper hyper_;
  bool sync_grads_ = true;                 // stages 0/1: reduce blocks in this backward
  bool update_armed_ = false;              // step_in_backward: this backward updates the blocks
  float update_scale_ = 1.f;
  double update_lr_ = -1.0;
  bool accumulated_ = false;               // step_in_backward: an earlier micro-step of this step ran
  Tensor update_norms_;                    // step_in_backward: squared norm of each block's gradient
  std::unique_ptr<Stream> comm_stream_;    // a device communicator with overlap_comm
  std::unique_ptr<Event> compute_ready_, comm_done_;  // with comm_stream_
  std::vector<Unit*> gather_order_, this_step_order_;
  size_t order_pos_ = 0;
  std::vector<std::unique_ptr<Event>> events_;
  size_t events_used_ = 0;
  double host_ms_ = 0;
};

}  // namespace zp::parallel
