// The gradient side of ZeRO data parallelism (DESIGN decision 2): averages each block's gradients
// over the data group as soon as its backward completes (the block is the bucket), on the
// collective stream, overlapping the backward of the blocks before it.
//   replicated gradients (stages 0/1): every rank keeps the block's full fp32 buffer; the last
//     micro-step's backward all-reduces it (earlier micro-steps only accumulate).
//   sharded gradients (stages 2/3): the full buffer exists only while the block's backward runs;
//     then it is reduce-scattered into the owner's fp32 slice (accumulated over micro-steps) and
//     freed on the collective stream.
// With the optimizer stepping inside the backward (armed for the last micro-step), the moment a
// block's slice is final the reducer hands it to `on_final` (the engine updates the block then).
#pragma once
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "nn/parameter.h"
#include "parallel/collective_stream.h"
#include "parallel/sharding_policy.h"

namespace zp::parallel {

class GradientReducer {
 public:
  // Called with block i's final, averaged gradient slice (the owned range's elements) and the
  // stream it is ready on.
  using FinalGradient = std::function<void(size_t block, const Tensor& grad, StreamHandle s)>;

  // `step_in_backward`: no step-long gradient slices (created only when micro-steps accumulate).
  GradientReducer(const ShardingPolicy& policy, comm::Communicator* dp, CollectiveStream& comm,
                  bool step_in_backward);

  // Takes over block b's gradients. Replicated: its full buffer must be bound. Sharded: the full
  // buffer is unbound and the owned slice's accumulator allocated. Blocks are numbered in order.
  void add(nn::ParamBlock& b);
  void on_final_gradient(FinalGradient f) { on_final_ = std::move(f); }

  // nn::BlockAccess's gradient half (the engine forwards to these).
  void acquire_grads(nn::ParamBlock& b);
  void release_grads(nn::ParamBlock& b);

  // Clears the accumulators; the step's first micro-step follows.
  void begin_step();
  // `last` = this backward completes the step's gradients (replicated gradients reduce then).
  void begin_micro_step(bool last) { sync_grads_ = last; }
  // The last micro-step's backward hands each block's final gradient to on_final_gradient().
  void arm() { armed_ = true; }
  bool armed() const { return armed_; }
  // Reduces any block the backward did not report and, armed, hands every block that did not get
  // its final gradient one (its accumulated slice, or zeros); then the compute stream waits for the
  // collectives. Disarms.
  void finish();

  // Squared L2 norm of the averaged gradients over every block but `excluded` (a pipeline stage's
  // replica of a block another stage counts; -1: none), identical on every rank.
  double norm_squared(int excluded = -1);
  // After finish(): adds the same block's gradients of the other members of `c` into block i's
  // (its owned slice when sharded, else the whole buffer), in place on the compute stream.
  void sum_over(size_t i, comm::Communicator& c);
  // Block i's averaged gradient for its owned range (fp32, device memory): the optimizer's input.
  const float* gradient(size_t i) const;

 private:
  struct Accumulator {
    nn::ParamBlock* block;
    int64_t shard_size;     // elements per rank
    Tensor shard;           // sharded: fp32 accumulator of the owned slice (step_in_backward: only
                            // when micro-steps accumulate)
    int refs = 0;
    bool reduced = false;   // replicated: all-reduced since it last accumulated (may be in flight)
    bool delivered = false; // armed: on_final_ has had this block's gradient
  };
  Accumulator& of(nn::ParamBlock& b);
  void all_reduce(Accumulator& a);
  void reduce_scatter(Accumulator& a);
  ShardingPolicy policy_;
  comm::Communicator* dp_;
  CollectiveStream& comm_;
  StreamHandle s_;
  int world_ = 1, rank_ = 0;
  bool step_in_backward_;
  std::vector<Accumulator> blocks_;
  FinalGradient on_final_;
  Tensor norm_sq_;
  bool sync_grads_ = true;  // replicated: reduce blocks in this backward
  bool armed_ = false;      // this backward delivers final gradients
  bool accumulated_ = false;  // armed: an earlier micro-step of this step accumulated
};

}  // namespace zp::parallel
