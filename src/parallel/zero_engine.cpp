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
    : stage_(stage), dp_(dp), s_(s) {
  ZP_CHECK(stage >= 0 && stage <= 3, "ZeRO stage ", stage);
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
    Unit u{b, b->padded() / world_, {}, {}, 0, 0, {}, {}};
    const int64_t begin = stage_ == 0 ? 0 : rank_ * u.shard, end = stage_ == 0 ? b->padded() : begin + u.shard;
    const size_t esz = dtype_size(b->dtype());
    if (stage_ == 3) {  // keep only the owned slice of the compute weights
      u.values_shard = Tensor::empty({u.shard}, b->dtype(), b->device(), "params", s);
      u.values_shard.copy_from(b->values().flat(begin, u.shard), s);
      b->bind_values(Tensor());  // frees the full buffer before the next block is filled
    }
    if (stage_ >= 2) {
      u.grad_shard = Tensor::zeros({u.shard}, DType::F32, b->device(), "grads", s);
      b->bind_grads(Tensor());
    }
    ranges.push_back({b, begin, end});
    initial.push_back(stage_ == 3 ? u.values_shard.data()
                                  : static_cast<const char*>(b->values().data()) + size_t(begin) * esz);
    units_.push_back(std::move(u));
  }
  opt_ = std::make_unique<ShardedAdamW>(ranges, initial, h, s);
  if (stage_ == 3 && dp_ && dp_->device().is_cuda()) comm_stream_ = std::make_unique<Stream>(dp_->device());
  if (!units_.empty()) norm_sq_ = Tensor::empty({1}, DType::F32, units_[0].block->device(), "metrics", s);
}

ZeroEngine::~ZeroEngine() = default;

template <class F>
void ZeroEngine::timed(F&& collective) {
  if (!timing_) return collective();
  if (!dp_ || dp_->device().is_cpu()) {
    const auto t0 = std::chrono::steady_clock::now();
    collective();
    host_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return;
  }
  while (events_.size() < events_used_ + 2) events_.push_back(std::make_unique<Event>());
  events_[events_used_]->record(s_);
  collective();
  events_[events_used_ + 1]->record(s_);
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
    if (dp_)
      timed([&] { dp_->all_gather(u.values_shard.data(), full.data(), u.shard, b.dtype(), s_); });
    else
      full.copy_from(u.values_shard, s_);
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
  Event queued;
  queued.record(s_);
  queued.wait_on(comm_stream_->handle());
  dp_->all_gather(u.values_shard.data(), u.prefetched.data(), u.shard, b.dtype(), comm_stream_->handle());
  u.prefetch_done = std::make_shared<Event>();
  u.prefetch_done->record(comm_stream_->handle());
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
  if (stage_ < 2) return;
  Unit& u = unit(b);
  if (u.grads_refs++ > 0) return;
  b.bind_grads(Tensor::zeros({b.padded()}, DType::F32, b.device(), "gradients in flight", s_));
}

void ZeroEngine::release_grads(nn::ParamBlock& b) {
  if (stage_ < 2) return;
  Unit& u = unit(b);
  ZP_CHECK(u.grads_refs > 0, "block ", b.name(), ": gradients released more often than acquired");
  if (--u.grads_refs > 0) return;
  // The block's gradients of this micro-step are complete: average them into the owners' slices.
  Tensor mine = b.grads().flat(rank_ * u.shard, u.shard);
  if (dp_) {
    mine = Tensor::empty({u.shard}, DType::F32, b.device(), "gradients in flight", s_);
    timed([&] { dp_->reduce_scatter(b.grads().data(), mine.data(), u.shard, DType::F32, comm::ReduceOp::Avg, s_); });
  }
  ZP_KERNEL_CALL(b.device(), axpy, s_, DType::F32, u.grad_shard.data(), 1.f, mine.data(), u.shard);
  b.bind_grads(Tensor());
}

void ZeroEngine::begin_step() {
  // The block order of the last step (forward, backward, any evaluation) predicts this one's.
  drop_prefetches();
  if (!this_step_order_.empty()) gather_order_.swap(this_step_order_);
  this_step_order_.clear();
  order_pos_ = 0;
  for (Unit& u : units_) {
    if (stage_ >= 2)
      u.grad_shard.zero_(s_);
    else
      u.block->zero_grad(s_);
  }
}

void ZeroEngine::finish_gradients() {
  if (stage_ >= 2 || !dp_) return;
  for (Unit& u : units_)
    timed([&] {
      dp_->all_reduce(u.block->grads().data(), u.block->grads().data(), u.block->padded(), DType::F32,
                      comm::ReduceOp::Avg, s_);
    });
}

double ZeroEngine::grad_norm_squared() {
  if (units_.empty()) return 0;
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
      timed([&] { dp_->all_gather(out[i], u.block->values().data(), u.shard, u.block->dtype(), s_); });
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
  p.grad_bytes = (stage_ >= 2 ? psi / n + 2.0 * double(largest) : psi) * 4.0;
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
