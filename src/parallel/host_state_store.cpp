#include "parallel/host_state_store.h"

#include <algorithm>
#include <cstring>

#include "core/allocator.h"
#include "core/log.h"
#include "kernels/elementwise.h"
#include "parallel/host_buffer.h"

namespace zp::parallel {
using namespace zp::kernels;


HostStateStore::HostStateStore(std::vector<OwnedRange> ranges, const InitialValues& initial, StreamHandle s,
                               bool pinned, int threads, int buffer_count, bool weights_on_host)
    : OptimizerStateStore(std::move(ranges)), pinned_(pinned), weights_on_host_(weights_on_host), adamw_(threads) {
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
  ring_ = std::make_unique<StagingRing>(dev_, dt_, std::min(kChunk, std::max<int64_t>(1, largest)), buffer_count,
                                        pinned_, weights_on_host_);
  // The initial master weights: the compute values, downloaded through the ring and widened to fp32.
  for (size_t i = 0; i < ranges_.size(); ++i)
    ring_->download(initial(i), ranges_[i].size(), s, [&](const void* piece, int64_t off, int64_t n) {
      cpu::cast(nullptr, DType::F32, master_[i].data<float>() + off, dt_, piece, n);
    });
}

size_t HostStateStore::state_bytes() const {
  size_t b = 0;
  for (size_t i = 0; i < master_.size(); ++i) b += master_[i].nbytes() + m_[i].nbytes() + v_[i].nbytes();
  return b;
}

size_t HostStateStore::staging_bytes() const { return ring_ ? ring_->bytes() : 0; }

float* HostStateStore::state(size_t i, OptimizerState which) {
  ZP_CHECK(i < ranges_.size(), "optimizer state of range ", i, " of ", ranges_.size());
  switch (which) {
    case OptimizerState::Master: return master_[i].data<float>();
    case OptimizerState::ExpAvg: return m_[i].data<float>();
    case OptimizerState::ExpAvgSq: return v_[i].data<float>();
  }
  ZP_FATAL("unknown optimizer state");
}

StateSpan HostStateStore::span(size_t range, int64_t begin) {
  return {master_[range].data<float>() + begin, m_[range].data<float>() + begin, v_[range].data<float>() + begin};
}

void HostStateStore::update(std::span<const RangeUpdate> updates, const AdamWHyper& h, const AdamWConfig& cfg,
                            StreamHandle s) {
  for (const RangeUpdate& u : updates)
    ZP_CHECK(u.range < ranges_.size(), "update of range ", u.range, " of ", ranges_.size());
  if (updates.empty()) return;
  if (dev_.is_cpu()) {
    // The blocks are host memory: one AdamW call over every range, no chunks.
    table_.clear();
    for (const RangeUpdate& u : updates)
      add_range_params(ranges_[u.range], 0, ranges_[u.range].size(), span(u.range, 0), u.grad, u.weights_out, h,
                       table_, /*zero_gaps=*/false);
    if (!table_.empty()) adamw_.step(table_.data(), int(table_.size()), cfg, dt_);
    return;
  }
  const std::vector<UpdateChunk> chunks = split_into_chunks(updates, ranges_, ring_->chunk());
  ring_->walk(chunks, updates, s, [&](size_t j, const float* grad, void* weights_out, bool staged) {
    const UpdateChunk& c = chunks[j];
    const size_t range = updates[c.update].range;
    table_.clear();
    add_range_params(ranges_[range], c.begin, c.end, span(range, c.begin), grad, weights_out, h, table_, staged);
    if (!table_.empty()) adamw_.step(table_.data(), int(table_.size()), cfg, dt_);
  });
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
  ring_->upload(weights_out, ranges_.at(i).size(), s, [&](void* piece, int64_t off, int64_t n) {
    cpu::cast(nullptr, dt_, piece, DType::F32, master_[i].data<float>() + off, n);
  });
}

}  // namespace zp::parallel
