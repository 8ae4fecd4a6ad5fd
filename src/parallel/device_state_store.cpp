#include "parallel/device_state_store.h"

#include <algorithm>

#include "kernels/elementwise.h"

namespace zp::parallel {
using namespace zp::kernels;

DeviceStateStore::DeviceStateStore(std::vector<OwnedRange> ranges, const InitialValues& initial,
                                   StreamHandle s)
    : OptimizerStateStore(std::move(ranges)) {
  for (size_t i = 0; i < ranges_.size(); ++i) {
    const OwnedRange& r = ranges_[i];
    const Device dev = r.block->device();
    master_.push_back(Tensor::empty({r.size()}, DType::F32, dev, "master", s));
    m_.push_back(Tensor::zeros({r.size()}, DType::F32, dev, "optimizer", s));
    v_.push_back(Tensor::zeros({r.size()}, DType::F32, dev, "optimizer", s));
    ZP_KERNEL_CALL(dev, cast, s, DType::F32, master_[i].data(), r.block->dtype(), initial(i), r.size());
  }
}

Tensor& DeviceStateStore::state(size_t i, OptimizerState which) {
  ZP_CHECK(i < ranges_.size(), "optimizer state of range ", i, " of ", ranges_.size());
  switch (which) {
    case OptimizerState::Master: return master_[i];
    case OptimizerState::ExpAvg: return m_[i];
    case OptimizerState::ExpAvgSq: return v_[i];
  }
  ZP_FATAL("unknown optimizer state");
}

void DeviceStateStore::add_range(const RangeUpdate& u, const AdamWHyper& h, std::vector<AdamWTensor>& table) {
  const OwnedRange& r = ranges_[u.range];
  const size_t esz = dtype_size(r.block->dtype());
  for (const auto& p : r.block->params()) {
    const int64_t lo = std::max(r.begin, p->offset), hi = std::min(r.end, p->offset + p->numel());
    if (lo >= hi) continue;
    const int64_t o = lo - r.begin;
    AdamWTensor t;
    t.param = master_[u.range].data<float>() + o;
    t.grad = u.grad + o;
    t.exp_avg = m_[u.range].data<float>() + o;
    t.exp_avg_sq = v_[u.range].data<float>() + o;
    t.param_copy = static_cast<char*>(u.weights_out) + size_t(o) * esz;
    t.n = hi - lo;
    t.weight_decay = (p->decay || h.decay_all) ? float(h.weight_decay) : 0.f;
    table.push_back(t);
  }
}

void DeviceStateStore::update(std::span<const RangeUpdate> updates, const AdamWHyper& h, const AdamWConfig& cfg,
                              StreamHandle s) {
  table_.clear();
  for (const RangeUpdate& u : updates) {
    ZP_CHECK(u.range < ranges_.size(), "update of range ", u.range, " of ", ranges_.size());
    add_range(u, h, table_);
  }
  if (table_.empty()) return;
  ZP_KERNEL_CALL(ranges_[0].block->device(), adamw_step, s, table_.data(), int(table_.size()), cfg,
                 ranges_[0].block->dtype());
}

void DeviceStateStore::read(size_t i, OptimizerState which, int64_t offset, int64_t count, float* host,
                            StreamHandle s) {
  const Tensor& t = state(i, which);
  ZP_CHECK(offset >= 0 && count >= 0 && offset + count <= t.numel(), "read of [", offset, ", ", offset + count,
           ") of ", t.numel(), " elements");
  copy_bytes(host, Device::cpu(), t.data<float>() + offset, t.device(), size_t(count) * sizeof(float), s);
}

void DeviceStateStore::write(size_t i, OptimizerState which, int64_t offset, int64_t count, const float* host,
                             StreamHandle s) {
  const Tensor& t = state(i, which);
  ZP_CHECK(offset >= 0 && count >= 0 && offset + count <= t.numel(), "write of [", offset, ", ", offset + count,
           ") of ", t.numel(), " elements");
  copy_bytes(t.data<float>() + offset, t.device(), host, Device::cpu(), size_t(count) * sizeof(float), s);
  if (s) stream_synchronize(s);  // the caller may reuse `host` now
}

void DeviceStateStore::write_weights(size_t i, void* weights_out, StreamHandle s) {
  const OwnedRange& r = ranges_.at(i);
  ZP_KERNEL_CALL(r.block->device(), cast, s, r.block->dtype(), weights_out, DType::F32, master_[i].data(), r.size());
}

}  // namespace zp::parallel
