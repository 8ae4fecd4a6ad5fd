#include "parallel/parameter_gatherer.h"

#include "parallel/host_buffer.h"

namespace zp::parallel {

ParameterGatherer::ParameterGatherer(comm::Communicator* dp, CollectiveStream& comm, StateTier tier, bool pinned)
    : dp_(dp), comm_(comm), s_(comm.compute()), tier_(tier), pinned_(pinned) {
  ZP_CHECK(tier_ == StateTier::Device || tier_ == StateTier::PinnedHost, "ParameterGatherer: parameters in ",
           tier_name(tier_), " are not implemented");
  if (dp_) {
    world_ = dp_->size();
    rank_ = dp_->rank();
  }
}

ParameterGatherer::~ParameterGatherer() {
  drop_prefetches();
  if (upload_) upload_->synchronize();  // no copy out of a host shard outlives it
}

void ParameterGatherer::add(nn::ParamBlock& b) {
  ZP_CHECK(b.values().defined(), "block ", b.name(), ": sharding needs its values bound");
  ZP_CHECK(gather_order_.empty() && this_step_order_.empty(), "block ", b.name(), " added after blocks were acquired");
  ZP_CHECK(b.padded() % (int64_t(world_) * nn::ParamBlock::kAlign) == 0, "block ", b.name(), " is padded to ",
           b.padded(), ", not a multiple of ", int64_t(world_) * nn::ParamBlock::kAlign);
  Sharded u{&b, b.padded() / world_, {}, 0, {}, {}};
  if (shards_on_host() && !b.device().is_cpu()) {
    u.shard = host_buffer(u.shard_size, b.dtype(), pinned_, "host_params", "the parameter shards");
    if (!upload_) {
      upload_ = std::make_unique<Stream>(b.device());
      upload_ready_ = std::make_unique<Event>();
    }
    copy_bytes(u.shard.data(), Device::cpu(), b.values().flat(rank_ * u.shard_size, u.shard_size).data(), b.device(),
               u.shard.nbytes(), s_);  // waits: the full buffer is freed next
  } else {
    u.shard = Tensor::empty({u.shard_size}, b.dtype(), b.device(), "params", s_);
    u.shard.copy_from(b.values().flat(rank_ * u.shard_size, u.shard_size), s_);
  }
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
    if (dp_ || u.shard.device() != b.device()) {
      comm_.after_compute();
      gather(u, full, comm_.handle());
      comm_.before_compute();
    } else {
      full.copy_from(u.shard, s_);
    }
    b.bind_values(std::move(full));
  }
  if (keep_) {
    u.kept = true;
    ++u.refs;
  }
  // Start gathering the block that came next in the previous step.
  if (prefetches() && order_pos_ < gather_order_.size() && gather_order_[order_pos_] == &u) {
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
  StreamHandle cs = nullptr;
  if (comm_.overlaps()) {
    comm_.after_compute();
    cs = comm_.handle();
  } else {  // a single rank with host shards: the upload stream
    upload_ready_->record(s_);
    upload_ready_->wait_on(upload_->handle());
    cs = upload_->handle();
  }
  gather(u, u.prefetched, cs);
  u.prefetch_done = std::make_shared<Event>();
  u.prefetch_done->record(cs);
}

bool ParameterGatherer::prefetches() const { return comm_.overlaps() || (upload_ && !dp_); }

void ParameterGatherer::gather(Sharded& u, Tensor& full, StreamHandle cs) {
  const nn::ParamBlock& b = *u.block;
  if (!dp_) {  // one rank: the shard is the whole block
    copy_bytes_async(full.data(), b.device(), u.shard.data(), u.shard.device(), u.shard.nbytes(), cs);
    return;
  }
  if (u.shard.device() == b.device()) {
    comm_.timed(CollectiveKind::AllGather, cs, [&] { dp_->all_gather(u.shard.data(), full.data(), u.shard_size, b.dtype(), cs); });
    return;
  }
  // A host shard goes up into this rank's block of the output, and the gather runs in place there:
  // no device copy of the shard exists, even for a moment.
  void* mine = static_cast<char*>(full.data()) + size_t(rank_) * u.shard.nbytes();
  copy_bytes_async(mine, b.device(), u.shard.data(), Device::cpu(), u.shard.nbytes(), cs);
  comm_.timed(CollectiveKind::AllGather, cs, [&] { dp_->all_gather(mine, full.data(), u.shard_size, b.dtype(), cs); });
}

size_t ParameterGatherer::shard_bytes() const {
  size_t n = 0;
  for (const Sharded& u : blocks_) n += u.shard.nbytes();
  return n;
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

void ParameterGatherer::release_kept() {
  for (Sharded& u : blocks_)
    if (u.kept) {
      u.kept = false;
      release_params(*u.block);
    }
}

void ParameterGatherer::begin_step() {
  drop_prefetches();
  if (!this_step_order_.empty()) gather_order_.swap(this_step_order_);
  this_step_order_.clear();
  order_pos_ = 0;
}

}  // namespace zp::parallel
