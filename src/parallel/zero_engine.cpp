#include "parallel/zero_engine.h"

#include <chrono>
#include <cmath>
#include <cstdio>

#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace zp::parallel {
using namespace zp::kernels;

int64_t shard_pad_multiple(int world) { return int64_t(world) * nn::ParamBlock::kAlign; }

ZeroEngine::ZeroEngine(std::vector<nn::ParamBlock*> blocks, int stage, comm::Communicator* dp, const AdamWHyper& h,
                       StreamHandle s)
    : ZeroEngine(std::move(blocks), stage, dp, h, s, BlockFill()) {}

ZeroEngine::ZeroEngine(std::vector<nn::ParamBlock*> blocks, int stage, comm::Communicator* dp, const AdamWHyper& h,
                       StreamHandle s, const BlockFill& fill)
    : stage_(stage), dp_(dp), s_(s), hyper_(h) {
  ZP_CHECK(stage >= 0 && stage <= 3, "ZeRO stage ", stage);
  ZP_REQUIRE(!h.step_in_backward || stage >= 2, "optimizer.step_in_backward needs zero_optimization.stage 2 or 3 "
             "(gradient buffers that live only while their block runs), got stage ", stage);
  if (dp_) {
    world_ = dp_->size();
    rank_ = dp_->rank();
  }
  std::vector<OwnedRange> ranges;
  std::vector<const void*> initial;
  std::vector<Tensor> keep_initial;  // stage 3 with fill: the values shard doubles as the initial values
  for (nn::ParamBlock* b : blocks) {
    ZP_CHECK(b->padded() % shard_pad_multiple(world_) == 0, "block ", b->name(), " is padded to ", b->padded(),
             ", not a multiple of ", shard_pad_multiple(world_));
    if (fill) {  // materialise this block now: full values while `fill` runs, gradients as the stage keeps them
      ZP_CHECK(!b->values().defined(), "block ", b->name(), " already allocated");
      b->bind_values(Tensor::zeros({b->padded()}, b->dtype(), b->device(), "params", s));
      if (stage_ < 2) b->bind_grads(Tensor::zeros({b->padded()}, DType::F32, b->device(), "grads", s));
      fill(*b);
    }
    Unit u{b, b->padded() / world_, {}, {}, 0, 0, false, false, {}, {}};
    const int64_t begin = stage_ == 0 ? 0 : rank_ * u.shard, end = stage_ == 0 ? b->padded() : begin + u.shard;
    const size_t esz = dtype_size(b->dtype());
    if (stage_ == 3) {  // keep only the owned slice of the compute weights
      u.values_shard = Tensor::empty({u.shard}, b->dtype(), b->device(), "params", s);
      u.values_shard.copy_from(b->values().flat(begin, u.shard), s);
      b->bind_values(Tensor());  // frees the full buffer before the next block is filled
    }
    if (stage_ >= 2) {
      if (!h.step_in_backward) u.grad_shard = Tensor::zeros({u.shard}, DType::F32, b->device(), "grads", s);
      b->bind_grads(Tensor());
    }
    ranges.push_back({b, begin, end});
    initial.push_back(stage_ == 3 ? u.values_shard.data()
                                  : static_cast<const char*>(b->values().data()) + size_t(begin) * esz);
    units_.push_back(std::move(u));
  }
  opt_ = std::make_unique<ShardedAdamW>(ranges, initial, h, s);
  set_overlap_comm(true);
  if (!units_.empty()) {
    norm_sq_ = Tensor::empty({1}, DType::F32, units_[0].block->device(), "metrics", s);
    if (h.step_in_backward)
      update_norms_ = Tensor::zeros({int64_t(units_.size())}, DType::F32, units_[0].block->device(), "metrics", s);
  }
}

void ZeroEngine::set_overlap_comm(bool on) {
  const bool device_comm = dp_ && dp_->size() > 1 && dp_->device().is_cuda();
  if (on && device_comm && !comm_stream_) {
    comm_stream_ = std::make_unique<Stream>(dp_->device(), -1);  // high priority: collectives start promptly
    compute_ready_ = std::make_unique<Event>();
    comm_done_ = std::make_unique<Event>();
  } else if (!on && comm_stream_) {
    drop_prefetches();
    compute_after_comm();
    stream_synchronize(comm_stream_->handle());
    comm_stream_.reset();
  }
}

void ZeroEngine::comm_after_compute() {
  if (!comm_stream_) return;
  compute_ready_->record(s_);
  compute_ready_->wait_on(comm_stream_->handle());
}

void ZeroEngine::compute_after_comm() {
  if (!comm_stream_) return;
  comm_done_->record(comm_stream_->handle());
  comm_done_->wait_on(s_);
}

ZeroEngine::~ZeroEngine() {
  if (comm_stream_) stream_synchronize(comm_stream_->handle());  // nothing in flight into freed buffers
  units_.clear();  // before the streams their buffers may be freed on
  opt_.reset();
}

template <class F>
void ZeroEngine::timed(StreamHandle s, F&& collective) {
  if (!timing_) return collective();
  if (!dp_ || dp_->device().is_cpu()) {
    const auto t0 = std::chrono::steady_clock::now();
    collective();
    host_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return;
  }
  while (events_.size() < events_used_ + 2) events_.push_back(std::make_unique<Event>());
  events_[events_used_]->record(s);
  collective();
  events_[events_used_ + 1]->record(s);
  events_used_ += 2;
}

double ZeroEngine::comm_ms() {
  double ms = host_ms_;
  for (size_t i = 0; i + 1 < events_used_; i += 2) {
    events_[i + 1]->synchronize();
    ms += events_[i + 1]->elapsed_ms_since(*events_[i]);
  }
  events_used_ = 0;
  host_ms_ = 0;
  return ms;
}

ZeroEngine::Unit& ZeroEngine::unit(nn::ParamBlock& b) {
  for (Unit& u : units_)
    if (u.block == &b) return u;
  ZP_FATAL("block ", b.name(), " is not managed by the ZeRO engine");
}

void ZeroEngine::acquire_params(nn::ParamBlock& b) {
  if (stage_ < 3) return;
  Unit& u = unit(b);
  if (u.params_refs++ > 0) return;
  this_step_order_.push_back(&u);
  if (u.prefetched.defined()) {  // gathered ahead on the comm stream
    u.prefetch_done->wait_on(s_);
    b.bind_values(std::move(u.prefetched));
    u.prefetched = Tensor();
    u.prefetch_done.reset();
  } else {
    Tensor full = Tensor::empty({b.padded()}, b.dtype(), b.device(), "gathered params", s_);
    if (dp_) {
      comm_after_compute();
      const StreamHandle cs = comm_stream();
      timed(cs, [&] { dp_->all_gather(u.values_shard.data(), full.data(), u.shard, b.dtype(), cs); });
      compute_after_comm();
    } else {
      full.copy_from(u.values_shard, s_);
    }
    b.bind_values(std::move(full));
  }
  // Start gathering the block that came next in the previous step.
  if (comm_stream_ && order_pos_ < gather_order_.size() && gather_order_[order_pos_] == &u) {
    ++order_pos_;
    if (order_pos_ < gather_order_.size()) prefetch(*gather_order_[order_pos_]);
  }
}

void ZeroEngine::prefetch(Unit& u) {
  if (u.params_refs > 0 || u.prefetched.defined()) return;
  nn::ParamBlock& b = *u.block;
  // Allocated on the compute stream (where it will be used and freed); the comm stream starts after
  // everything enqueued so far on the compute stream, the optimizer's writes to the shard included.
  u.prefetched = Tensor::empty({b.padded()}, b.dtype(), b.device(), "gathered params", s_);
  comm_after_compute();
  const StreamHandle cs = comm_stream_->handle();
  timed(cs, [&] { dp_->all_gather(u.values_shard.data(), u.prefetched.data(), u.shard, b.dtype(), cs); });
  u.prefetch_done = std::make_shared<Event>();
  u.prefetch_done->record(cs);
}

void ZeroEngine::drop_prefetches() {
  for (Unit& u : units_) {
    if (!u.prefetched.defined()) continue;
    u.prefetch_done->wait_on(s_);  // the buffer is freed on the compute stream: after its gather
    u.prefetched = Tensor();
    u.prefetch_done.reset();
  }
}

void ZeroEngine::release_params(nn::ParamBlock& b) {
  if (stage_ < 3) return;
  Unit& u = unit(b);
  ZP_CHECK(u.params_refs > 0, "block ", b.name(), ": params released more often than acquired");
  if (--u.params_refs == 0) b.bind_values(Tensor());
}

void ZeroEngine::acquire_grads(nn::ParamBlock& b) {
  Unit& u = unit(b);
  if (u.grads_refs++ > 0) return;
  if (stage_ < 2) {
    // More gradient accumulates into the replicated buffer: it needs reducing again (averaging the
    // already averaged part again is exact), after the reduction in flight, if any, has finished.
    if (u.reduced) compute_after_comm();
    u.reduced = false;
    return;
  }
  b.bind_grads(Tensor::zeros({b.padded()}, DType::F32, b.device(), "gradients in flight", s_));
}

void ZeroEngine::release_grads(nn::ParamBlock& b) {
  Unit& u = unit(b);
  ZP_CHECK(u.grads_refs > 0, "block ", b.name(), ": gradients released more often than acquired");
  if (--u.grads_refs > 0) return;
  // The block's gradients of this micro-step are complete.
  if (stage_ < 2) {
    if (sync_grads_ && dp_) all_reduce_grads(u);
    return;
  }
  reduce_scatter_grads(u);
}

void ZeroEngine::all_reduce_grads(Unit& u) {
  comm_after_compute();
  const StreamHandle cs = comm_stream();
  void* g = u.block->grads().data();
  timed(cs, [&] { dp_->all_reduce(g, g, u.block->padded(), DType::F32, comm::ReduceOp::Avg, cs); });
  u.reduced = true;
}

void ZeroEngine::reduce_scatter_grads(Unit& u) {
  nn::ParamBlock& b = *u.block;
  Tensor full = b.grads();
  b.bind_grads(Tensor());
  const bool accumulate = !update_armed_ || accumulated_;
  if (accumulate && !u.grad_shard.defined())  // step_in_backward with accumulation: created on first use
    u.grad_shard = Tensor::zeros({u.shard}, DType::F32, b.device(), "grads", s_);
  comm_after_compute();
  const StreamHandle cs = comm_stream();
  full.free_on(cs);  // its last reader is the reduce-scatter
  // Average into this rank's slice; the temporaries live and die on the communication stream.
  Tensor mine = full.flat(rank_ * u.shard, u.shard);
  if (dp_) {
    mine = Tensor::empty({u.shard}, DType::F32, b.device(), "gradients in flight", cs);
    timed(cs, [&] { dp_->reduce_scatter(full.data(), mine.data(), u.shard, DType::F32, comm::ReduceOp::Avg, cs); });
  }
  if (accumulate) {
    accumulated_ = accumulated_ || !update_armed_;
    ZP_KERNEL_CALL(b.device(), axpy, cs, DType::F32, u.grad_shard.data(), 1.f, mine.data(), u.shard);
  }
  if (!update_armed_) return;
  // The optimizer in the backward: this block's slice is final, update it now.
  update_in_backward(u, accumulate ? u.grad_shard : mine, cs);
}

void ZeroEngine::update_in_backward(Unit& u, const Tensor& grad, StreamHandle cs) {
  nn::ParamBlock& b = *u.block;
  const size_t i = size_t(&u - units_.data());
  const void* gp = grad.data();
  ZP_KERNEL_CALL(b.device(), l2norm_squared, cs, DType::F32, update_norms_.data<float>() + i, &gp, &u.shard, 1);
  const OwnedRange& r = opt_->ranges()[i];
  void* out = stage_ == 3 ? u.values_shard.data()
                          : static_cast<char*>(b.values().data()) + size_t(r.begin) * dtype_size(b.dtype());
  opt_->update(i, grad.data<float>(), out, update_scale_, update_lr_, cs);
  if (stage_ == 2 && dp_) timed(cs, [&] { dp_->all_gather(out, b.values().data(), u.shard, b.dtype(), cs); });
  u.updated = true;
}

void ZeroEngine::begin_step() {
  ZP_CHECK(!update_armed_, "ZeroEngine: a step began before the previous one's finish_gradients()");
  // The block order of the last step (forward, backward, any evaluation) predicts this one's.
  drop_prefetches();
  if (!this_step_order_.empty()) gather_order_.swap(this_step_order_);
  this_step_order_.clear();
  order_pos_ = 0;
  sync_grads_ = true;
  accumulated_ = false;
  for (Unit& u : units_) {
    u.reduced = u.updated = false;
    if (stage_ < 2)
      u.block->zero_grad(s_);
    else if (u.grad_shard.defined())
      u.grad_shard.zero_(s_);
  }
  if (update_norms_.defined()) update_norms_.zero_(s_);
}

void ZeroEngine::begin_micro_step(bool last) {
  ZP_CHECK(!update_armed_, "ZeroEngine: a micro-step began after the update in the backward was set");
  sync_grads_ = last;
}

void ZeroEngine::set_update_in_backward(float grad_scale, double lr) {
  ZP_CHECK(hyper_.step_in_backward, "ZeroEngine::set_update_in_backward without optimizer.step_in_backward");
  opt_->advance();
  update_armed_ = true;
  update_scale_ = grad_scale;
  update_lr_ = lr;
}

void ZeroEngine::finish_gradients() {
  if (stage_ < 2 && dp_)
    for (Unit& u : units_)
      if (!u.reduced) all_reduce_grads(u);  // blocks the backward did not report
  if (update_armed_)  // a block the backward did not use still gets its step (weight decay), as in step()
    for (Unit& u : units_)
      if (!u.updated) {
        comm_after_compute();
        Tensor g = u.grad_shard.defined() ? u.grad_shard
                                          : Tensor::zeros({u.shard}, DType::F32, u.block->device(), "grads", comm_stream());
        update_in_backward(u, g, comm_stream());
      }
  compute_after_comm();
  update_armed_ = false;
}

double ZeroEngine::grad_norm_squared() {
  if (units_.empty()) return 0;
  if (update_norms_.defined()) {  // stepping in the backward: each block's part was taken before its update
    const int64_t n = update_norms_.numel();
    if (dp_) dp_->all_reduce(update_norms_.data(), update_norms_.data(), n, DType::F32, comm::ReduceOp::Sum, s_);
    Tensor h = update_norms_.to(Device::cpu(), s_);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += double(h.data<float>()[i]);
    return sum;
  }
  std::vector<const void*> ptrs;
  std::vector<int64_t> sizes;
  for (Unit& u : units_) {
    ptrs.push_back(stage_ >= 2 ? u.grad_shard.data() : u.block->grads().data());
    sizes.push_back(stage_ >= 2 ? u.shard : u.block->padded());
  }
  const Device dev = units_[0].block->device();
  ZP_KERNEL_CALL(dev, l2norm_squared, s_, DType::F32, norm_sq_.data<float>(), ptrs.data(), sizes.data(),
                 int(ptrs.size()));
  if (stage_ >= 2 && dp_)  // each rank holds a part of the sum
    dp_->all_reduce(norm_sq_.data(), norm_sq_.data(), 1, DType::F32, comm::ReduceOp::Sum, s_);
  return double(norm_sq_.to(Device::cpu(), s_).data<float>()[0]);
}

void ZeroEngine::refresh_compute_weights() {
  for (size_t i = 0; i < units_.size(); ++i) {
    Unit& u = units_[i];
    const OwnedRange& r = opt_->ranges()[i];
    const size_t esz = dtype_size(u.block->dtype());
    void* out = stage_ == 3 ? u.values_shard.data() : static_cast<char*>(u.block->values().data()) + size_t(r.begin) * esz;
    ZP_KERNEL_CALL(u.block->device(), cast, s_, u.block->dtype(), out, DType::F32, opt_->master(i).data(), r.size());
    if ((stage_ == 1 || stage_ == 2) && dp_) dp_->all_gather(out, u.block->values().data(), u.shard, u.block->dtype(), s_);
  }
}

void ZeroEngine::step(float grad_scale, double lr) {
  ZP_CHECK(!hyper_.step_in_backward, "ZeroEngine::step with optimizer.step_in_backward (the backward updates)");
  drop_prefetches();  // they hold the weights before this update
  std::vector<const float*> grads;
  std::vector<void*> out;
  for (size_t i = 0; i < units_.size(); ++i) {
    Unit& u = units_[i];
    const OwnedRange& r = opt_->ranges()[i];
    const size_t esz = dtype_size(u.block->dtype());
    grads.push_back(stage_ >= 2 ? u.grad_shard.data<float>() : u.block->grads().data<float>() + r.begin);
    out.push_back(stage_ == 3 ? u.values_shard.data() : static_cast<char*>(u.block->values().data()) + size_t(r.begin) * esz);
  }
  opt_->step(grads, out, grad_scale, lr);
  if ((stage_ == 1 || stage_ == 2) && dp_)
    for (size_t i = 0; i < units_.size(); ++i) {
      Unit& u = units_[i];
      timed(s_, [&] { dp_->all_gather(out[i], u.block->values().data(), u.shard, u.block->dtype(), s_); });
    }
}

std::vector<float> ZeroEngine::gather_master() {
  std::vector<float> all;
  for (size_t i = 0; i < units_.size(); ++i) {
    Unit& u = units_[i];
    Tensor full = opt_->master(i);
    if (stage_ > 0 && dp_) {
      full = Tensor::empty({u.block->padded()}, DType::F32, u.block->device(), "gather", s_);
      dp_->all_gather(opt_->master(i).data(), full.data(), u.shard, DType::F32, s_);
    }
    Tensor h = full.to(Device::cpu(), s_);
    for (const auto& p : u.block->params())  // parameters only: padding depends on the world size
      all.insert(all.end(), h.data<float>() + p->offset, h.data<float>() + p->offset + p->numel());
  }
  return all;
}

MemoryPlan ZeroEngine::memory_plan() const {
  MemoryPlan p;
  int64_t largest = 0;
  size_t k = 2;
  for (const Unit& u : units_) {
    p.params += u.block->padded();
    largest = std::max(largest, u.block->padded());
    k = dtype_size(u.block->dtype());
  }
  const double psi = double(p.params), n = double(world_);
  p.param_bytes = (stage_ == 3 ? psi / n + 2.0 * double(largest) : psi) * double(k);
  // Stepping in the backward keeps no gradient shard, only the blocks in flight (no accumulation).
  const double grad_shards = hyper_.step_in_backward ? 0.0 : psi / n;
  p.grad_bytes = (stage_ >= 2 ? grad_shards + 2.0 * double(largest) : psi) * 4.0;
  p.optimizer_bytes = (stage_ == 0 ? psi : psi / n) * 12.0;
  return p;
}

std::string MemoryPlan::str(int stage, int world) const {
  char buf[512];
  const double mib = double(1ull << 20);
  std::snprintf(buf, sizeof(buf),
                "memory plan (ZeRO stage %d, %d rank%s, per rank): parameters %.1f MiB + gradients %.1f MiB (fp32) + "
                "optimizer %.1f MiB (fp32 master and moments) = %.1f MiB for %.2fM parameters (the ZeRO paper's "
                "2Ψ + 2Ψ + 12Ψ/N, 16-bit gradients: %.1f MiB); activations come on top",
                stage, world, world == 1 ? "" : "s", param_bytes / mib, grad_bytes / mib, optimizer_bytes / mib,
                (param_bytes + grad_bytes + optimizer_bytes) / mib, double(params) / 1e6,
                (4.0 * double(params) + 12.0 * double(params) / world) / mib);
  return buf;
}

}  // namespace zp::parallel
