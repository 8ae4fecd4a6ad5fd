#include "parallel/parameter_gatherer.h"

namespace zp::parallel {

ParameterGatherer::ParameterGatherer(comm::Communicator* dp, CollectiveStream& comm)
    : dp_(dp), comm_(comm), s_(comm.compute()) {
  if (dp_) {
    world_ = dp_->size();
    rank_ = dp_->rank();
  }
}

ParameterGatherer::~ParameterGatherer() { drop_prefetches(); }

void ParameterGatherer::add(nn::ParamBlock& b) {
  ZP_CHECK(b.values().defined(), "block ", b.name(), ": sharding needs its values bound");
  ZP_CHECK(gather_order_.empty() && this_step_order_.empty(), "block ", b.name(), " added after blocks were acquired");
  ZP_CHECK(b.padded() % (int64_t(world_) * nn::ParamBlock::kAlign) == 0, "block ", b.name(), " is padded to ",
           b.padded(), ", not a multiple of ", int64_t(world_) * nn::ParamBlock::kAlign);
  Sharded u{&b, b.padded() / world_, {}, 0, {}, {}};
  u.shard = Tensor::empty({u.shard_size}, b.dtype(), b.device(), "params", s_);
  u.shard.copy_from(b.values().flat(rank_ * u.shard_size, u.shard_size), s_);
  b.bind_values(Tensor());  // frees the full buffer before the next block is filled
  blocks_.push_back(std::move(u));
}

ParameterGatherer::Sharded& ParameterGatherer::of(nn::ParamBlock& b) {
  for (Sharded& u : blocks_)
    if (u.block == &b) return u;
  ZP_FATAL("block ", b.name(), " is not sharded by this parameter gatherer");
}

void ParameterGatherer::acquire_params(nn::ParamBlock& b) {
  Sharded& u = of(b);
  if (u.refs++ > 0) return;
  this_step_order_.push_back(&u);
  if (u.prefetched.defined()) {  // gathered ahead on the comm stream
    u.prefetch_done->wait_on(s_);
    b.bind_values(std::move(u.prefetched));
    u.prefetched = Tensor();
    u.prefetch_done.reset();
  } else {
    Tensor full = Tensor::empty({b.padded()}, b.dtype(), b.device(), "gathered params", s_);
    if (dp_) {
      comm_.after_compute();
      const StreamHandle cs = comm_.handle();
      comm_.timed(cs, [&] { dp_->all_gather(u.shard.data(), full.data(), u.shard_size, b.dtype(), cs); });
      comm_.before_compute();
    } else {
      full.copy_from(u.shard, s_);
    }
    b.bind_values(std::move(full));
  }
  // Start gathering the block that came next in the previous step.
  if (comm_.overlaps() && order_pos_ < gather_order_.size() && gather_order_[order_pos_] == &u) {
    ++order_pos_;
    if (order_pos_ < gather_order_.size()) prefetch(*gather_order_[order_pos_]);
  }
}

void ParameterGatherer::prefetch(Sharded& u) {
  if (u.refs > 0 || u.prefetched.defined()) return;
  nn::ParamBlock& b = *u.block;
  // Allocated on the compute stream (where it will be used and freed); the comm stream starts after
  // everything enqueued so far on the compute stream, the optimizer's writes to the shard included.
  u.prefetched = Tensor::empty({b.padded()}, b.dtype(), b.device(), "gathered params", s_);
  comm_.after_compute();
  const StreamHandle cs = comm_.handle();
  comm_.timed(cs, [&] { dp_->all_gather(u.shard.data(), u.prefetched.data(), u.shard_size, b.dtype(), cs); });
  u.prefetch_done = std::make_shared<Event>();
  u.prefetch_done->record(cs);
}

void ParameterGatherer::drop_prefetches() {
  for (Sharded& u : blocks_) {
    if (!u.prefetched.defined()) continue;
    u.prefetch_done->wait_on(s_);  // the buffer is freed on the compute stream: after its gather
    u.prefetched = Tensor();
    u.prefetch_done.reset();
  }
}

void ParameterGatherer::release_params(nn::ParamBlock& b) {
  Sharded& u = of(b);
  ZP_CHECK(u.refs > 0, "block ", b.name(), ": params released more often than acquired");
  if (--u.refs == 0) b.bind_values(Tensor());
}

void ParameterGatherer::begin_step() {
  drop_prefetches();
  if (!this_step_order_.empty()) gather_order_.swap(this_step_order_);
  this_step_order_.clear();
  order_pos_ = 0;
}

}  // namespace zp::parallel
