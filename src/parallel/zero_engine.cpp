#include "parallel/zero_engine.h"

#include <cmath>
#include <cstdio>

#include "kernels/elementwise.h"
#include "kernels/reduce.h"
#include "nn/trained_blocks.h"
#include "parallel/host_state_store.h"
#include "parallel/nvme_state_store.h"
#include "parallel/split_state_store.h"

namespace zp::parallel {
using namespace zp::kernels;

int64_t shard_pad_multiple(int world) { return int64_t(world) * nn::ParamBlock::kAlign; }

// The compute weights of each owned range (weights_out), for checkpoints of a delayed-update run.
class ZeroEngine::LaggingAccess final : public LaggingWeights {
 public:
  explicit LaggingAccess(ZeroEngine& e) : e_(e) {}
  void read(size_t range, int64_t offset, int64_t count, float* host) override {
    const DType dt = e_.blocks_.at(range)->dtype();
    Tensor t = Tensor::empty({count}, dt, Device::cpu(), "checkpoint");
    copy_bytes(t.data(), Device::cpu(), at(range, offset), e_.weights_device(), t.nbytes(), e_.s_);
    cpu::cast(nullptr, DType::F32, host, dt, t.data(), count);
  }
  void write(size_t range, int64_t offset, int64_t count, const float* host) override {
    const DType dt = e_.blocks_.at(range)->dtype();
    Tensor t = Tensor::empty({count}, dt, Device::cpu(), "checkpoint");
    cpu::cast(nullptr, dt, t.data(), DType::F32, host, count);
    copy_bytes(at(range, offset), e_.weights_device(), t.data(), Device::cpu(), t.nbytes(), e_.s_);
  }

 private:
  char* at(size_t range, int64_t offset) const {
    return static_cast<char*>(e_.weights_out(range)) + size_t(offset) * dtype_size(e_.blocks_[range]->dtype());
  }
  ZeroEngine& e_;
};

ZeroEngine::ZeroEngine(std::vector<nn::ParamBlock*> blocks, const ShardingPolicy& policy, comm::Communicator* dp,
                       const AdamWHyper& h, StreamHandle s)
    : ZeroEngine(std::move(blocks), policy, dp, h, s, BlockFill()) {}

ZeroEngine::ZeroEngine(std::vector<nn::ParamBlock*> blocks, const ShardingPolicy& policy, comm::Communicator* dp,
                       const AdamWHyper& h, StreamHandle s, const BlockFill& fill)
    : policy_(policy), dp_(dp), s_(s), hyper_(h), all_blocks_(std::move(blocks)), comm_(dp, s) {
  blocks_ = nn::trained_blocks(all_blocks_);
  policy_.require_implemented();
  ZP_REQUIRE(!h.step_in_backward || !policy_.delays_update(), "optimizer.step_in_backward and "
             "zero_optimization.offload_optimizer.delayed_update cannot both be on: stepping in the backward updates "
             "each block at once, there is no step-long update to delay");
  ZP_REQUIRE(!h.step_in_backward || policy_.shards_gradients(), "optimizer.step_in_backward needs "
             "zero_optimization.stage 2 or 3 (gradient buffers that live only while their block runs), got stage ",
             policy_.stage());
  if (dp_) {
    world_ = dp_->size();
    rank_ = dp_->rank();
  }
  if (policy_.shards_parameters())
    gatherer_ = std::make_unique<ParameterGatherer>(dp_, comm_, policy_.parameter_tier(), policy_.pin_host_memory(),
                                                    policy_.parameter_nvme());
  if (gatherer_) gatherer_->set_keep_gathered(policy_.keeps_gathered());
  reducer_ = std::make_unique<GradientReducer>(policy_, dp_, comm_, h.step_in_backward);
  std::vector<OwnedRange> ranges;
  std::vector<const void*> initial;  // without sharded parameters: in the full values
  for (nn::ParamBlock* b : all_blocks_) {
    ZP_CHECK(b->padded() % shard_pad_multiple(world_) == 0, "block ", b->name(), " is padded to ", b->padded(),
             ", not a multiple of ", shard_pad_multiple(world_));
    if (fill) {  // materialise this block now: full values while `fill` runs, gradients as the policy keeps them
      ZP_CHECK(!b->values().defined(), "block ", b->name(), " already allocated");
      b->bind_values(Tensor::zeros({b->padded()}, b->dtype(), b->device(), "params", s));
      if (!policy_.shards_gradients() && !b->frozen())
        b->bind_grads(Tensor::zeros({b->padded()}, DType::F32, b->device(), "grads", s));
      fill(*b);
    }
    if (b->frozen()) {  // weights only: gathered like any other at stage 3, never reduced or updated
      if (gatherer_) gatherer_->add(*b);
      continue;
    }
    const int64_t shard = b->padded() / world_;
    const bool owns_all = !policy_.shards_optimizer_state();
    const int64_t begin = owns_all ? 0 : rank_ * shard, end = owns_all ? b->padded() : begin + shard;
    if (gatherer_) {  // keeps only the owned slice of the compute weights
      gatherer_->add(*b);
      gathered_index_.push_back(gatherer_->size() - 1);
    }
    reducer_->add(*b);
    ranges.push_back({b, begin, end});
    if (!gatherer_)
      initial.push_back(static_cast<const char*>(b->values().data()) + size_t(begin) * dtype_size(b->dtype()));
  }
  for (size_t i = 0; i < blocks_.size(); ++i) trained_.push_back(i);
  // The device store writes the new weights with a kernel: into host shards only through pinned
  // (device-mapped) memory.
  const bool params_on_nvme = policy_.parameter_tier() == StateTier::Nvme;
  const bool gpu_updates = policy_.optimizer_tier() == StateTier::Device || policy_.offload_ratio() < 1.0;
  ZP_REQUIRE(!gatherer_ || !gatherer_->shards_on_host() || gatherer_->pinned() || blocks_.empty() ||
                 blocks_[0]->device().is_cpu() || !gpu_updates,
             "zero_optimization.offload_param.device = \"", params_on_nvme ? "nvme" : "cpu",
             "\" with pageable parameter ", params_on_nvme ? "buffers" : "shards",
             " (pin_memory false, or pinning refused) needs zero_optimization.offload_optimizer.device = \"cpu\" or "
             "\"nvme\" with ratio 1: the GPU's optimizer cannot write pageable host memory");
  // With sharded parameters the master weights start from the shards, one at a time (on NVMe they
  // pass through one of its buffers).
  const InitialValues start =
      gatherer_ ? InitialValues([this](size_t i) { return gatherer_->shard_data(gathered_index_[i], s_); })
                : initial_values_at(std::move(initial));
  opt_ = std::make_unique<ShardedAdamW>(make_optimizer_state_store(policy_, std::move(ranges), start, s), h, s);
  // The device store reads the last block's initial values on `s` after it returns; the gatherer may
  // reuse the memory they came from (an NVMe buffer) from now on.
  if (gatherer_ && s) stream_synchronize(s);
  if (policy_.delays_update()) {
    const bool weights_on_host = gatherer_ && gatherer_->shards_on_host() && !blocks_.empty() &&
                                 blocks_[0]->device().is_cuda();
    delayed_ = std::make_unique<DelayedUpdate>(*opt_, weights_on_host, policy_.pin_host_memory(), s);
    lagging_ = std::make_unique<LaggingAccess>(*this);
  }
  reducer_->on_final_gradient([this](size_t i, const Tensor& grad, StreamHandle cs) { update_in_backward(i, grad, cs); });
  set_overlap_comm(true);
  if (!blocks_.empty() && h.step_in_backward)
    update_norms_ = Tensor::zeros({int64_t(blocks_.size())}, DType::F32, blocks_[0]->device(), "metrics", s);
}

ZeroEngine::~ZeroEngine() {
  delayed_.reset();     // waits for the update in flight, which uses the state store
  comm_.synchronize();  // nothing in flight into freed buffers
  gatherer_.reset();    // before the stream their buffers may be freed on
  reducer_.reset();
  opt_.reset();
}

void ZeroEngine::set_overlap_comm(bool on) {
  if (!on && comm_.overlaps() && gatherer_) gatherer_->drop_prefetches();
  comm_.set_overlap(on);
}

void* ZeroEngine::weights_out(size_t i) const {
  if (gatherer_) return gatherer_->shard(gathered_index_[i]).data();  // in memory: not on NVMe
  const OwnedRange& r = opt_->ranges()[i];
  return static_cast<char*>(r.block->values().data()) + size_t(r.begin) * dtype_size(r.block->dtype());
}

void ZeroEngine::write_new_weights(std::span<const size_t> trained, StreamHandle s, const NewWeights& write) {
  std::vector<void*> outs;
  if (!gatherer_) {
    for (size_t i : trained) outs.push_back(weights_out(i));
    write(trained, outs);
    return;
  }
  std::vector<size_t> gathered;
  for (size_t i : trained) gathered.push_back(gathered_index_[i]);
  gatherer_->rewrite_shards(gathered, s, [&](size_t first, std::span<void* const> group_outs) {
    write(trained.subspan(first, group_outs.size()), group_outs);
  });
}

Device ZeroEngine::weights_device() const {
  if (gatherer_ && gatherer_->shards_on_host()) return Device::cpu();
  return blocks_.empty() ? Device::cpu() : blocks_[0]->device();
}

void ZeroEngine::acquire_params(nn::ParamBlock& b) {
  if (gatherer_) gatherer_->acquire_params(b);
}

void ZeroEngine::release_params(nn::ParamBlock& b) {
  if (gatherer_) gatherer_->release_params(b);
}

void ZeroEngine::acquire_grads(nn::ParamBlock& b) { reducer_->acquire_grads(b); }

void ZeroEngine::release_grads(nn::ParamBlock& b) { reducer_->release_grads(b); }

void ZeroEngine::update_in_backward(size_t i, const Tensor& grad, StreamHandle cs) {
  nn::ParamBlock& b = *blocks_[i];
  const int64_t n = opt_->ranges()[i].size();
  const void* gp = grad.data();
  ZP_KERNEL_CALL(b.device(), l2norm_squared, cs, DType::F32, update_norms_.data<float>() + i, &gp, &n, 1);
  write_new_weights({&i, 1}, cs, [&](std::span<const size_t>, std::span<void* const> outs) {
    opt_->update({i, grad.data<float>(), outs[0]}, update_scale_, update_sched_, cs);
    if (policy_.gathers_updated_weights() && dp_)
      comm_.timed(CollectiveKind::AllGather, cs, [&] { dp_->all_gather(outs[0], b.values().data(), n, b.dtype(), cs); });
  });
}

void ZeroEngine::begin_step() {
  ZP_CHECK(!reducer_->armed(), "ZeroEngine: a step began before the previous one's finish_gradients()");
  if (gatherer_) gatherer_->begin_step();
  reducer_->begin_step();
  if (update_norms_.defined()) update_norms_.zero_(s_);
}

void ZeroEngine::begin_micro_step(bool last) {
  ZP_CHECK(!reducer_->armed(), "ZeroEngine: a micro-step began after the update in the backward was set");
  reducer_->begin_micro_step(last);
}

void ZeroEngine::set_update_in_backward(float grad_scale, const ScheduledHyper& sched) {
  ZP_CHECK(hyper_.step_in_backward, "ZeroEngine::set_update_in_backward without optimizer.step_in_backward");
  opt_->advance();
  reducer_->arm();
  update_scale_ = grad_scale;
  update_sched_ = sched;
}

void ZeroEngine::finish_gradients() { reducer_->finish(); }

size_t ZeroEngine::index_of(const nn::ParamBlock& b) const {
  for (size_t i = 0; i < blocks_.size(); ++i)
    if (blocks_[i] == &b) return i;
  ZP_FATAL("block ", b.name(), " is not one of the engine's");
}

void ZeroEngine::sum_gradients_over(const nn::ParamBlock& b, comm::Communicator& c) {
  ZP_CHECK(!hyper_.step_in_backward, "sum_gradients_over with optimizer.step_in_backward (already updated)");
  reducer_->sum_over(index_of(b), c);
}

double ZeroEngine::grad_norm_squared(const nn::ParamBlock* excluded) {
  if (blocks_.empty()) return 0;
  if (update_norms_.defined()) {  // stepping in the backward: each block's part was taken before its update
    ZP_CHECK(!excluded, "a block left out of the norm with optimizer.step_in_backward");
    const int64_t n = update_norms_.numel();
    if (dp_) dp_->all_reduce(update_norms_.data(), update_norms_.data(), n, DType::F32, comm::ReduceOp::Sum, s_);
    Tensor h = update_norms_.to(Device::cpu(), s_);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += double(h.data<float>()[i]);
    return sum;
  }
  return reducer_->norm_squared(excluded ? int(index_of(*excluded)) : -1);
}

void ZeroEngine::refresh_compute_weights() {
  write_new_weights(trained_, s_, [&](std::span<const size_t> group, std::span<void* const> outs) {
    for (size_t j = 0; j < group.size(); ++j) opt_->state().write_weights(group[j], outs[j], s_);
  });
  all_gather_compute_weights();
}

void ZeroEngine::all_gather_compute_weights() {
  if (!policy_.gathers_updated_weights() || !dp_) return;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    nn::ParamBlock& b = *blocks_[i];
    const int64_t n = opt_->ranges()[i].size();
    comm_.timed(CollectiveKind::AllGather, s_, [&] { dp_->all_gather(weights_out(i), b.values().data(), n, b.dtype(), s_); });
  }
}

void ZeroEngine::step(float grad_scale, const ScheduledHyper& sched) {
  ZP_CHECK(!hyper_.step_in_backward, "ZeroEngine::step with optimizer.step_in_backward (the backward updates)");
  if (gatherer_) {  // they hold the weights before this update
    gatherer_->drop_prefetches();
    gatherer_->release_kept();
  }
  if (delayed_) {
    const std::vector<Tensor*> shards = delayed_ranges();
    if (delayed_->step(updates_, opt_->next_config(grad_scale, sched), shards)) all_gather_compute_weights();
    return;
  }
  updates_.clear();
  // One update of every block, in the groups the parameter tier can take new weights for at once
  // (all blocks unless the shards are on NVMe).
  const kernels::AdamWConfig cfg = opt_->next_config(grad_scale, sched);
  write_new_weights(trained_, s_, [&](std::span<const size_t> group, std::span<void* const> outs) {
    updates_.clear();
    for (size_t j = 0; j < group.size(); ++j) updates_.push_back({group[j], reducer_->gradient(group[j]), outs[j]});
    opt_->update_with(updates_, cfg, s_);
  });
  all_gather_compute_weights();
}

std::vector<Tensor*> ZeroEngine::delayed_ranges() {
  updates_.clear();
  for (size_t i = 0; i < blocks_.size(); ++i) updates_.push_back({i, reducer_->gradient(i), weights_out(i)});
  // ZeRO-3 shards are whole tensors the delayed update may exchange with its spares.
  std::vector<Tensor*> shards;
  if (gatherer_ && gatherer_->tier() != StateTier::Nvme)
    for (size_t i = 0; i < blocks_.size(); ++i) shards.push_back(&gatherer_->shard(gathered_index_[i]));
  return shards;
}

void ZeroEngine::skip_step() {
  ZP_CHECK(!hyper_.step_in_backward, "ZeroEngine::skip_step with optimizer.step_in_backward (the backward updates)");
  if (!delayed_ || !delayed_->pending()) return;  // nothing changes: the weights stay what they are
  if (gatherer_) {  // they hold the weights before the installed update
    gatherer_->drop_prefetches();
    gatherer_->release_kept();
  }
  const std::vector<Tensor*> shards = delayed_ranges();
  if (delayed_->skip(updates_, shards)) all_gather_compute_weights();
}

std::vector<float> ZeroEngine::gather_master() {
  if (delayed_) delayed_->wait();
  std::vector<float> all;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    nn::ParamBlock& b = *blocks_[i];
    const OwnedRange& r = opt_->ranges()[i];
    Tensor h = Tensor::empty({r.size()}, DType::F32, Device::cpu(), "gather");
    opt_->state().read(i, OptimizerState::Master, 0, r.size(), h.data<float>(), s_);
    if (policy_.shards_optimizer_state() && dp_) {
      const Tensor mine = b.device().is_cpu() ? h : h.to(b.device(), s_);
      Tensor full = Tensor::empty({b.padded()}, DType::F32, b.device(), "gather", s_);
      dp_->all_gather(mine.data(), full.data(), r.size(), DType::F32, s_);
      h = full.to(Device::cpu(), s_);
    }
    for (const auto& p : b.params())  // parameters only: padding depends on the world size
      all.insert(all.end(), h.data<float>() + p->offset, h.data<float>() + p->offset + p->numel());
  }
  return all;
}

void ZeroEngine::visit_state(const EngineStateVisitor& visit, StreamHandle s) {
  if (delayed_) delayed_->wait();
  bool master_written = false, lagging_written = false;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const int64_t shard = blocks_[i]->padded() / world_;
    BlockState st(opt_->ranges()[i], rank_ * shard, (rank_ + 1) * shard, opt_->state(), i, s, lagging_.get());
    visit(st);
    master_written = master_written || st.master_written();
    lagging_written = lagging_written || st.lagging_written();
  }
  if (!master_written && !lagging_written) return;
  if (gatherer_) {  // they hold the weights before the visit
    gatherer_->drop_prefetches();
    gatherer_->release_kept();
  }
  if (lagging_written) {
    // The compute weights are the checkpoint's; the loaded master weights wait for the next step.
    all_gather_compute_weights();
    if (master_written) delayed_->stage_master_weights();
    return;
  }
  refresh_compute_weights();
  if (delayed_) delayed_->drop_pending();
}

MemoryPlan ZeroEngine::memory_plan() const {
  const bool gpu = !blocks_.empty() && blocks_[0]->device().is_cuda();
  MemoryPlan p = plan_memory(all_blocks_, policy_, world_, hyper_.step_in_backward, gpu);
  // Pinning may have been refused since the policy asked for it.
  const OptimizerStateStore* offloaded = &opt_->state();
  if (const auto* split = dynamic_cast<const SplitStateStore*>(offloaded)) offloaded = &split->offloaded_part();
  if (const auto* host = dynamic_cast<const HostStateStore*>(offloaded)) p.host_pinned = host->pinned();
  if (const auto* nvme = dynamic_cast<const NvmeStateStore*>(offloaded)) p.host_pinned = nvme->pinned();
  if (gatherer_ && gatherer_->shards_on_host()) p.host_pinned = p.host_pinned && gatherer_->pinned();
  return p;
}

}  // namespace zp::parallel
