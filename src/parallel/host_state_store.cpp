#include "parallel/host_state_store.h"

#include <algorithm>
#include <cstring>

#include "core/allocator.h"
#include "core/log.h"
#include "kernels/elementwise.h"
#include "parallel/host_buffer.h"

namespace zp::parallel {
using namespace zp::kernels;

// One staging slot: a chunk's gradients on their way down and its new weights on their way up.
// `downloaded` is recorded on the copy stream after the gradients arrive; `uploaded` after the
// weights left. The copy stream runs in order, so a slot's next download is queued behind its last
// upload and may be issued as soon as the CPU is done with the slot.
struct HostStateStore::Slot {
  Tensor grad, weights;
  Event downloaded, uploaded;
};

HostStateStore::HostStateStore(std::vector<OwnedRange> ranges, const std::vector<const void*>& initial, StreamHandle s,
                               bool pinned, int threads, int buffer_count, bool weights_on_host)
    : OptimizerStateStore(std::move(ranges)), pinned_(pinned), weights_on_host_(weights_on_host), adamw_(threads) {
  ZP_CHECK(initial.size() == ranges_.size(), "HostStateStore: ", initial.size(), " initial values for ",
           ranges_.size(), " ranges");
  ZP_CHECK(buffer_count >= 1, "HostStateStore: ", buffer_count, " staging buffers");
  if (ranges_.empty()) return;
  dev_ = ranges_[0].block->device();
  dt_ = ranges_[0].block->dtype();
  int64_t largest = 0;
  for (const OwnedRange& r : ranges_) {
    ZP_CHECK(r.block->device() == dev_ && r.block->dtype() == dt_, "HostStateStore: blocks on one device in one dtype");
    largest = std::max(largest, r.size());
  }
  // Pinning is for copies to and from a GPU: a CPU run has none. pinned_ turns false at the first
  // refusal; later allocations then do not try again.
  if (dev_.is_cpu()) pinned_ = false;
  for (size_t i = 0; i < ranges_.size(); ++i) {
    master_.push_back(host_buffer(ranges_[i].size(), DType::F32, pinned_, "host_master", "the optimizer state"));
    m_.push_back(host_buffer(ranges_[i].size(), DType::F32, pinned_, "host_optimizer", "the optimizer state"));
    v_.push_back(host_buffer(ranges_[i].size(), DType::F32, pinned_, "host_optimizer", "the optimizer state"));
  }
  if (dev_.is_cpu()) {
    for (size_t i = 0; i < ranges_.size(); ++i)
      cpu::cast(nullptr, DType::F32, master_[i].data(), dt_, initial[i], ranges_[i].size());
    return;
  }
  copy_ = std::make_unique<Stream>(dev_);
  const int64_t chunk = std::min(kChunk, largest);
  for (int k = 0; k < buffer_count; ++k) {
    auto slot = std::make_unique<Slot>();
    slot->grad = Tensor::empty({chunk}, DType::F32, Device::cpu(), "host_staging", nullptr, pinned_);
    slot->weights = Tensor::empty({chunk}, dt_, Device::cpu(), "host_staging", nullptr, pinned_);
    slots_.push_back(std::move(slot));
  }
  // The initial master weights: the compute values, downloaded through a slot and widened to fp32.
  Tensor& stage = slots_[0]->weights;
  for (size_t i = 0; i < ranges_.size(); ++i)
    for (int64_t off = 0; off < ranges_[i].size(); off += chunk) {
      const int64_t n = std::min(chunk, ranges_[i].size() - off);
      copy_bytes(stage.data(), Device::cpu(), static_cast<const char*>(initial[i]) + size_t(off) * dtype_size(dt_),
                 dev_, size_t(n) * dtype_size(dt_), s);
      stream_synchronize(s);
      cpu::cast(nullptr, DType::F32, master_[i].data<float>() + off, dt_, stage.data(), n);
    }
}

HostStateStore::~HostStateStore() {
  if (copy_) copy_->synchronize();  // no copy into or out of a slot outlives it
}

size_t HostStateStore::state_bytes() const {
  size_t b = 0;
  for (size_t i = 0; i < master_.size(); ++i) b += master_[i].nbytes() + m_[i].nbytes() + v_[i].nbytes();
  return b;
}

size_t HostStateStore::staging_bytes() const {
  size_t b = 0;
  for (const auto& slot : slots_) b += slot->grad.nbytes() + slot->weights.nbytes();
  return b;
}

float* HostStateStore::state(size_t i, OptimizerState which) {
  ZP_CHECK(i < ranges_.size(), "optimizer state of range ", i, " of ", ranges_.size());
  switch (which) {
    case OptimizerState::Master: return master_[i].data<float>();
    case OptimizerState::ExpAvg: return m_[i].data<float>();
    case OptimizerState::ExpAvgSq: return v_[i].data<float>();
  }
  ZP_FATAL("unknown optimizer state");
}

void HostStateStore::add_params(const RangeUpdate& u, int64_t begin, int64_t end, const float* grad,
                                void* weights_out, const AdamWHyper& h, std::vector<AdamWTensor>& table,
                                bool zero_gaps) {
  const OwnedRange& r = ranges_[u.range];
  const size_t esz = dtype_size(dt_);
  int64_t covered = begin;  // parameters are laid out in order: what lies before one is a gap
  auto gap_until = [&](int64_t to) {
    if (zero_gaps && to > covered)
      std::memset(static_cast<char*>(weights_out) + size_t(covered - begin) * esz, 0, size_t(to - covered) * esz);
  };
  for (const auto& p : r.block->params()) {
    // The parameter's part of the range, as offsets relative to the range, clipped to [begin, end).
    const int64_t lo = std::max(begin, p->offset - r.begin), hi = std::min(end, p->offset + p->numel() - r.begin);
    if (lo >= hi) continue;
    gap_until(lo);
    covered = hi;
    AdamWTensor t;
    t.param = master_[u.range].data<float>() + lo;
    t.grad = grad + (lo - begin);
    t.exp_avg = m_[u.range].data<float>() + lo;
    t.exp_avg_sq = v_[u.range].data<float>() + lo;
    t.param_copy = static_cast<char*>(weights_out) + size_t(lo - begin) * esz;
    t.n = hi - lo;
    t.weight_decay = (p->decay || h.decay_all) ? float(h.weight_decay) : 0.f;
    table.push_back(t);
  }
  gap_until(end);
}

void HostStateStore::update(std::span<const RangeUpdate> updates, const AdamWHyper& h, const AdamWConfig& cfg,
                            StreamHandle s) {
  for (const RangeUpdate& u : updates)
    ZP_CHECK(u.range < ranges_.size(), "update of range ", u.range, " of ", ranges_.size());
  if (updates.empty()) return;
  if (dev_.is_cpu()) {
    table_.clear();
    for (const RangeUpdate& u : updates)
      add_params(u, 0, ranges_[u.range].size(), u.grad, u.weights_out, h, table_, /*zero_gaps=*/false);
    if (!table_.empty()) adamw_.step(table_.data(), int(table_.size()), cfg, dt_);
    return;
  }
  update_on_device(updates, h, cfg, s);
}

void HostStateStore::update_on_device(std::span<const RangeUpdate> updates, const AdamWHyper& h,
                                      const AdamWConfig& cfg, StreamHandle s) {
  const int64_t chunk = slots_[0]->grad.numel();
  std::vector<Chunk> chunks;
  for (size_t k = 0; k < updates.size(); ++k)
    for (int64_t b = 0; b < ranges_[updates[k].range].size(); b += chunk)
      chunks.push_back({k, b, std::min(b + chunk, ranges_[updates[k].range].size())});
  if (chunks.empty()) return;
  const StreamHandle cs = copy_->handle();
  const size_t esz = dtype_size(dt_);
  // The gradients are complete when `s` reaches this point.
  Event grads_ready;
  grads_ready.record(s);
  grads_ready.wait_on(cs);
  auto download = [&](size_t j) {
    const Chunk& c = chunks[j];
    Slot& slot = *slots_[j % slots_.size()];
    copy_bytes_async(slot.grad.data(), Device::cpu(), updates[c.update].grad + c.begin, dev_,
                     size_t(c.end - c.begin) * sizeof(float), cs);
    slot.downloaded.record(cs);
  };
  for (size_t j = 0; j < std::min(chunks.size(), slots_.size()); ++j) download(j);
  for (size_t j = 0; j < chunks.size(); ++j) {
    const Chunk& c = chunks[j];
    const RangeUpdate& u = updates[c.update];
    Slot& slot = *slots_[j % slots_.size()];
    // Also orders this slot's previous upload (queued before the download) before the CPU writes
    // new weights into it.
    slot.downloaded.synchronize();
    table_.clear();
    char* out = static_cast<char*>(u.weights_out) + size_t(c.begin) * esz;
    if (weights_on_host_) {  // the parameter tier: the new weights go straight into their host shard
      add_params(u, c.begin, c.end, slot.grad.data<float>(), out, h, table_, /*zero_gaps=*/false);
      if (!table_.empty()) adamw_.step(table_.data(), int(table_.size()), cfg, dt_);
    } else {
      // The whole chunk goes up, alignment gaps included: they must arrive as the zeros they are.
      add_params(u, c.begin, c.end, slot.grad.data<float>(), slot.weights.data(), h, table_, /*zero_gaps=*/true);
      if (!table_.empty()) adamw_.step(table_.data(), int(table_.size()), cfg, dt_);
      copy_bytes_async(out, dev_, slot.weights.data(), Device::cpu(), size_t(c.end - c.begin) * esz, cs);
      slot.uploaded.record(cs);
    }
    if (j + slots_.size() < chunks.size()) download(j + slots_.size());
  }
  // The last upload is the last thing on the copy stream: the compute stream waits for it. Weights
  // written on the host are complete now, and every download was waited for.
  if (!weights_on_host_) slots_[(chunks.size() - 1) % slots_.size()]->uploaded.wait_on(s);
}

void HostStateStore::read(size_t i, OptimizerState which, int64_t offset, int64_t count, float* host,
                          StreamHandle s) {
  ZP_CHECK(offset >= 0 && count >= 0 && offset + count <= ranges_.at(i).size(), "read of [", offset, ", ",
           offset + count, ") of ", ranges_[i].size(), " elements");
  // An update in flight on the copy stream may still be writing weights, never state: the CPU
  // writes state only inside update(), which has returned.
  std::copy_n(state(i, which) + offset, count, host);
}

void HostStateStore::write(size_t i, OptimizerState which, int64_t offset, int64_t count, const float* host,
                           StreamHandle s) {
  ZP_CHECK(offset >= 0 && count >= 0 && offset + count <= ranges_.at(i).size(), "write of [", offset, ", ",
           offset + count, ") of ", ranges_[i].size(), " elements");
  std::copy_n(host, count, state(i, which) + offset);
}

void HostStateStore::write_weights(size_t i, void* weights_out, StreamHandle s) {
  const OwnedRange& r = ranges_.at(i);
  if (dev_.is_cpu()) {
    cpu::cast(nullptr, dt_, weights_out, DType::F32, master_[i].data(), r.size());
    return;
  }
  if (copy_) copy_->synchronize();  // the slot is free
  Tensor& stage = slots_[0]->weights;
  const int64_t chunk = stage.numel();
  const size_t esz = dtype_size(dt_);
  for (int64_t off = 0; off < r.size(); off += chunk) {
    const int64_t n = std::min(chunk, r.size() - off);
    cpu::cast(nullptr, dt_, stage.data(), DType::F32, master_[i].data<float>() + off, n);
    copy_bytes(static_cast<char*>(weights_out) + size_t(off) * esz, dev_, stage.data(), Device::cpu(),
               size_t(n) * esz, s);
    stream_synchronize(s);  // before the next piece overwrites the staging slot
  }
}

}  // namespace zp::parallel
