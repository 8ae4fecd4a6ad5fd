#include "parallel/parameter_gatherer.h"

#include <vector>

#include "parallel/host_buffer.h"

namespace zp::parallel {

ParameterGatherer::ParameterGatherer(comm::Communicator* dp, CollectiveStream& comm, StateTier tier, bool pinned,
                                     const NvmeSettings& nvme)
    : dp_(dp), comm_(comm), s_(comm.compute()), tier_(tier), pinned_(pinned), nvme_settings_(nvme) {
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
  const int64_t shard_size = b.padded() / world_;
  add_slice(b, b.values().flat(rank_ * shard_size, shard_size));
  b.bind_values(Tensor());  // frees the full buffer before the next block is filled
}

void ParameterGatherer::add_slice(nn::ParamBlock& b, const Tensor& slice) {
  ZP_CHECK(gather_order_.empty() && this_step_order_.empty(), "block ", b.name(), " added after blocks were acquired");
  ZP_CHECK(b.padded() % (int64_t(world_) * nn::ParamBlock::kAlign) == 0, "block ", b.name(), " is padded to ",
           b.padded(), ", not a multiple of ", int64_t(world_) * nn::ParamBlock::kAlign);
  Sharded u{&b, b.padded() / world_, {}, 0, 0, false, {}, {}};
  ZP_CHECK(slice.numel() == u.shard_size && slice.dtype() == b.dtype() &&
               (slice.device().is_cpu() || slice.device() == b.device()),
           "block ", b.name(), ": a slice of ", slice.numel(), " ", dtype_name(slice.dtype()), " elements, not ",
           u.shard_size, " ", dtype_name(b.dtype()));
  if (tier_ == StateTier::Nvme) {
    if (!nvme_) nvme_ = std::make_unique<NvmeParameterShards>(nvme_settings_, b.device().is_cuda(), pinned_);
    u.nvme_index = nvme_->add(b.name(), slice.data(), slice.device(), u.shard_size, b.dtype(), s_);
  } else if (shards_on_host() && !b.device().is_cpu()) {
    u.shard = host_buffer(u.shard_size, b.dtype(), pinned_, "host_params", "the parameter shards");
    copy_bytes(u.shard.data(), Device::cpu(), slice.data(), slice.device(), u.shard.nbytes(),
               s_);  // waits: the caller frees the slice next
  } else {
    u.shard = Tensor::empty({u.shard_size}, b.dtype(), b.device(), "params", s_);
    u.shard.copy_from(slice, s_);
    if (slice.device().is_cpu() && b.device().is_cuda()) stream_synchronize(s_);  // the caller frees the slice next
  }
  if (shards_on_host() && !b.device().is_cpu() && !upload_) {
    upload_ = std::make_unique<Stream>(b.device());
    upload_ready_ = std::make_unique<Event>();
  }
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
  const bool in_order = order_pos_ < gather_order_.size() && gather_order_[order_pos_] == &u;
  if (in_order) ++order_pos_;  // gather_order_[order_pos_] is now the block expected next
  if (nvme_) read_ahead(u);
  if (u.prefetched.defined()) {  // gathered ahead on the comm stream
    u.prefetch_done->wait_on(s_);
    b.bind_values(std::move(u.prefetched));
    u.prefetched = Tensor();
    u.prefetch_done.reset();
  } else {
    Tensor full = Tensor::empty({b.padded()}, b.dtype(), b.device(), "gathered params", s_);
    if (dp_ || tier_ == StateTier::Nvme || u.shard.device() != b.device()) {
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
  if (prefetches() && in_order && order_pos_ < gather_order_.size()) prefetch(*gather_order_[order_pos_]);
}

void ParameterGatherer::read_ahead(const Sharded& u) {
  nvme_->read_ahead(u.nvme_index);  // first, so the reads ahead do not take u's buffer
  if (order_pos_ == 0 || gather_order_[order_pos_ - 1] != &u) return;  // off the learned order
  const size_t ahead = size_t(nvme_->buffer_count() - 1);
  for (size_t k = order_pos_; k < gather_order_.size() && k < order_pos_ + ahead; ++k)
    nvme_->read_ahead(gather_order_[k]->nvme_index);
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
  const bool nvme = tier_ == StateTier::Nvme;
  // On NVMe the shard is in a buffer from the swap file (read ahead, or now), held until the work
  // enqueued on cs below has read it.
  const void* src = nvme ? nvme_->take(u.nvme_index) : u.shard.data();
  const Device src_dev = nvme ? Device::cpu() : u.shard.device();
  const size_t bytes = size_t(u.shard_size) * dtype_size(b.dtype());
  if (!dp_) {  // one rank: the shard is the whole block
    copy_bytes_async(full.data(), b.device(), src, src_dev, bytes, cs);
  } else if (src_dev == b.device()) {
    comm_.timed(CollectiveKind::AllGather, cs, [&] { dp_->all_gather(src, full.data(), u.shard_size, b.dtype(), cs); });
  } else {
    // A host shard goes up into this rank's block of the output, and the gather runs in place there:
    // no device copy of the shard exists, even for a moment.
    void* mine = static_cast<char*>(full.data()) + size_t(rank_) * bytes;
    copy_bytes_async(mine, b.device(), src, Device::cpu(), bytes, cs);
    comm_.timed(CollectiveKind::AllGather, cs, [&] { dp_->all_gather(mine, full.data(), u.shard_size, b.dtype(), cs); });
  }
  if (nvme) nvme_->release(u.nvme_index, cs);
}

size_t ParameterGatherer::shard_bytes() const {
  size_t n = 0;
  for (const Sharded& u : blocks_) n += size_t(u.shard_size) * dtype_size(u.block->dtype());
  return n;
}

Tensor& ParameterGatherer::shard(size_t i) {
  ZP_CHECK(tier_ != StateTier::Nvme, "ParameterGatherer::shard: the shards are on NVMe (use shard_data or "
           "rewrite_shards)");
  return blocks_.at(i).shard;
}

const void* ParameterGatherer::shard_data(size_t i, StreamHandle s) {
  if (tier_ != StateTier::Nvme) return shard(i).data();
  // The previous call's buffer may be reused by this one: the work reading it ends first (a GPU's
  // stream; on the CPU it has ended already).
  if (s) {
    Event read;
    read.record(s);
    read.synchronize();
  }
  const size_t k = blocks_.at(i).nvme_index;
  const void* at = nvme_->take(k);
  nvme_->release(k, nullptr);
  return at;
}

void ParameterGatherer::rewrite_shards(std::span<const size_t> blocks, StreamHandle s, const ShardFill& fill) {
  std::vector<void*> outs;
  if (tier_ != StateTier::Nvme) {
    for (size_t i : blocks) outs.push_back(shard(i).data());
    fill(0, outs);
    return;
  }
  std::vector<size_t> group;
  const size_t per_group = size_t(nvme_->buffer_count());
  for (size_t first = 0; first < blocks.size(); first += per_group) {
    outs.clear();
    group.clear();
    for (size_t j = first; j < blocks.size() && j < first + per_group; ++j) {
      group.push_back(blocks_.at(blocks[j]).nvme_index);
      outs.push_back(nvme_->begin_write(group.back()));
    }
    fill(first, outs);
    nvme_->commit(group, s);
  }
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
