#include "parallel/gradient_reducer.h"

#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace zp::parallel {
using namespace zp::kernels;

GradientReducer::GradientReducer(const ShardingPolicy& policy, comm::Communicator* dp, CollectiveStream& comm,
                                 bool step_in_backward)
    : policy_(policy), dp_(dp), comm_(comm), s_(comm.compute()), step_in_backward_(step_in_backward) {
  if (dp_) {
    world_ = dp_->size();
    rank_ = dp_->rank();
  }
}

void GradientReducer::add(nn::ParamBlock& b) {
  Accumulator a{&b, b.padded() / world_, {}, 0, false, false};
  if (policy_.shards_gradients()) {
    if (!step_in_backward_) a.shard = Tensor::zeros({a.shard_size}, DType::F32, b.device(), "grads", s_);
    b.bind_grads(Tensor());
  } else {
    ZP_CHECK(b.grads().defined(), "block ", b.name(), ": replicated gradients need its gradient buffer bound");
  }
  if (!norm_sq_.defined()) norm_sq_ = Tensor::empty({1}, DType::F32, b.device(), "metrics", s_);
  blocks_.push_back(std::move(a));
}

GradientReducer::Accumulator& GradientReducer::of(nn::ParamBlock& b) {
  for (Accumulator& a : blocks_)
    if (a.block == &b) return a;
  ZP_FATAL("block ", b.name(), " is not managed by the ZeRO engine");
}

void GradientReducer::acquire_grads(nn::ParamBlock& b) {
  Accumulator& a = of(b);
  if (a.refs++ > 0) return;
  if (!policy_.shards_gradients()) {
    // More gradient accumulates into the replicated buffer: it needs reducing again (averaging the
    // already averaged part again is exact), after the reduction in flight, if any, has finished.
    if (a.reduced) comm_.before_compute();
    a.reduced = false;
    return;
  }
  b.bind_grads(Tensor::zeros({b.padded()}, DType::F32, b.device(), "gradients in flight", s_));
}

void GradientReducer::release_grads(nn::ParamBlock& b) {
  Accumulator& a = of(b);
  ZP_CHECK(a.refs > 0, "block ", b.name(), ": gradients released more often than acquired");
  if (--a.refs > 0) return;
  // The block's gradients of this micro-step are complete.
  if (!policy_.shards_gradients()) {
    if (sync_grads_ && dp_) all_reduce(a);
    return;
  }
  reduce_scatter(a);
}

void GradientReducer::all_reduce(Accumulator& a) {
  comm_.after_compute();
  const StreamHandle cs = comm_.handle();
  void* g = a.block->grads().data();
  comm_.timed(CollectiveKind::AllReduce, cs, [&] { dp_->all_reduce(g, g, a.block->padded(), DType::F32, comm::ReduceOp::Avg, cs); });
  a.reduced = true;
}

void GradientReducer::reduce_scatter(Accumulator& a) {
  nn::ParamBlock& b = *a.block;
  Tensor full = b.grads();
  b.bind_grads(Tensor());
  const bool accumulate = !armed_ || accumulated_;
  if (accumulate && !a.shard.defined())  // step_in_backward with accumulation: created on first use
    a.shard = Tensor::zeros({a.shard_size}, DType::F32, b.device(), "grads", s_);
  comm_.after_compute();
  const StreamHandle cs = comm_.handle();
  full.free_on(cs);  // its last reader is the reduce-scatter
  // Average into this rank's slice; the temporaries live and die on the communication stream.
  Tensor mine = full.flat(rank_ * a.shard_size, a.shard_size);
  if (dp_) {
    mine = Tensor::empty({a.shard_size}, DType::F32, b.device(), "gradients in flight", cs);
    comm_.timed(CollectiveKind::ReduceScatter, cs, [&] {
      dp_->reduce_scatter(full.data(), mine.data(), a.shard_size, DType::F32, comm::ReduceOp::Avg, cs);
    });
  }
  if (accumulate) {
    accumulated_ = accumulated_ || !armed_;
    ZP_KERNEL_CALL(b.device(), axpy, cs, DType::F32, a.shard.data(), 1.f, mine.data(), a.shard_size);
  }
  if (!armed_) return;
  // The optimizer in the backward: this block's slice is final.
  on_final_(size_t(&a - blocks_.data()), accumulate ? a.shard : mine, cs);
  a.delivered = true;
}

void GradientReducer::begin_step() {
  sync_grads_ = true;
  accumulated_ = false;
  for (Accumulator& a : blocks_) {
    a.reduced = a.delivered = false;
    if (!policy_.shards_gradients())
      a.block->zero_grad(s_);
    else if (a.shard.defined())
      a.shard.zero_(s_);
  }
}

void GradientReducer::finish() {
  if (!policy_.shards_gradients() && dp_)
    for (Accumulator& a : blocks_)
      if (!a.reduced) all_reduce(a);  // blocks the backward did not report
  if (armed_)  // a block the backward did not use still gets its step (weight decay), as in step()
    for (Accumulator& a : blocks_)
      if (!a.delivered) {
        comm_.after_compute();
        Tensor g = a.shard.defined()
                       ? a.shard
                       : Tensor::zeros({a.shard_size}, DType::F32, a.block->device(), "grads", comm_.handle());
        on_final_(size_t(&a - blocks_.data()), g, comm_.handle());
        a.delivered = true;
      }
  comm_.before_compute();
  armed_ = false;
}

double GradientReducer::norm_squared(int excluded) {
  if (blocks_.empty()) return 0;
  std::vector<const void*> ptrs;
  std::vector<int64_t> sizes;
  const bool sharded = policy_.shards_gradients();
  for (size_t i = 0; i < blocks_.size(); ++i) {
    if (int(i) == excluded) continue;
    const Accumulator& a = blocks_[i];
    ptrs.push_back(sharded ? a.shard.data() : a.block->grads().data());
    sizes.push_back(sharded ? a.shard_size : a.block->padded());
  }
  if (ptrs.empty()) return 0;
  const Device dev = blocks_[0].block->device();
  ZP_KERNEL_CALL(dev, l2norm_squared, s_, DType::F32, norm_sq_.data<float>(), ptrs.data(), sizes.data(),
                 int(ptrs.size()));
  if (sharded && dp_)  // each rank holds a part of the sum
    dp_->all_reduce(norm_sq_.data(), norm_sq_.data(), 1, DType::F32, comm::ReduceOp::Sum, s_);
  return double(norm_sq_.to(Device::cpu(), s_).data<float>()[0]);
}

void GradientReducer::sum_over(size_t i, comm::Communicator& c) {
  Accumulator& a = blocks_.at(i);
  const bool sharded = policy_.shards_gradients();
  void* g = sharded ? a.shard.data() : a.block->grads().data();
  c.all_reduce(g, g, sharded ? a.shard_size : a.block->padded(), DType::F32, comm::ReduceOp::Sum, s_);
}

const float* GradientReducer::gradient(size_t i) const {
  const Accumulator& a = blocks_.at(i);
  if (policy_.shards_gradients()) return a.shard.data<float>();
  // Replicated: the owned range of the full buffer (all of it when the optimizer is not sharded).
  const int64_t begin = policy_.shards_optimizer_state() ? rank_ * a.shard_size : 0;
  return a.block->grads().data<float>() + begin;
}

}  // namespace zp::parallel
