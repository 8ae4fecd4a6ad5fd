#include "parallel/host_update.h"

#include <algorithm>
#include <cstring>

namespace zp::parallel {
using namespace zp::kernels;

void add_range_params(const OwnedRange& r, int64_t begin, int64_t end, StateSpan state, const float* grad,
                      void* weights_out, const AdamWHyper& h, std::vector<AdamWTensor>& table, bool zero_gaps) {
  const size_t esz = dtype_size(r.block->dtype());
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
    t.param = state.master + (lo - begin);
    t.grad = grad + (lo - begin);
    t.exp_avg = state.exp_avg + (lo - begin);
    t.exp_avg_sq = state.exp_avg_sq + (lo - begin);
    t.param_copy = static_cast<char*>(weights_out) + size_t(lo - begin) * esz;
    t.n = hi - lo;
    t.weight_decay = (p->decay || h.decay_all) ? float(h.weight_decay) : 0.f;
    table.push_back(t);
  }
  gap_until(end);
}

std::vector<UpdateChunk> split_into_chunks(std::span<const RangeUpdate> updates, const std::vector<OwnedRange>& ranges,
                                           int64_t chunk) {
  std::vector<UpdateChunk> chunks;
  for (size_t k = 0; k < updates.size(); ++k) {
    const int64_t n = ranges.at(updates[k].range).size();
    for (int64_t b = 0; b < n; b += chunk) chunks.push_back({k, b, std::min(b + chunk, n)});
  }
  return chunks;
}

// One staging slot: a chunk's gradients on their way down and its new weights on their way up.
// `downloaded` is recorded on the copy stream after the gradients arrive; `uploaded` after the
// weights left. The copy stream runs in order, so a slot's next download is queued behind its last
// upload and may be issued as soon as the CPU is done with the slot.
struct StagingRing::Slot {
  Tensor grad, weights;
  Event downloaded, uploaded;
};

StagingRing::StagingRing(Device dev, DType dt, int64_t chunk, int slots, bool pinned, bool weights_on_host)
    : dev_(dev), dt_(dt), chunk_(chunk), weights_on_host_(weights_on_host) {
  ZP_CHECK(chunk > 0 && slots >= 1, "StagingRing: ", slots, " slots of ", chunk, " elements");
  if (dev_.is_cpu()) return;
  copy_ = std::make_unique<Stream>(dev_);
  for (int k = 0; k < slots; ++k) {
    auto slot = std::make_unique<Slot>();
    slot->grad = Tensor::empty({chunk}, DType::F32, Device::cpu(), "host_staging", nullptr, pinned);
    slot->weights = Tensor::empty({chunk}, dt_, Device::cpu(), "host_staging", nullptr, pinned);
    slots_.push_back(std::move(slot));
  }
}

StagingRing::~StagingRing() {
  if (copy_) copy_->synchronize();
}

size_t StagingRing::bytes() const {
  size_t b = 0;
  for (const auto& slot : slots_) b += slot->grad.nbytes() + slot->weights.nbytes();
  return b;
}

void StagingRing::walk(const std::vector<UpdateChunk>& chunks, std::span<const RangeUpdate> updates, StreamHandle s,
                       const ChunkBody& body) {
  const size_t esz = dtype_size(dt_);
  if (dev_.is_cpu()) {
    for (size_t j = 0; j < chunks.size(); ++j) {
      const UpdateChunk& c = chunks[j];
      const RangeUpdate& u = updates[c.update];
      body(j, u.grad + c.begin, static_cast<char*>(u.weights_out) + size_t(c.begin) * esz, false);
    }
    return;
  }
  if (chunks.empty()) return;
  const StreamHandle cs = copy_->handle();
  // The gradients are complete when `s` reaches this point.
  Event grads_ready;
  grads_ready.record(s);
  grads_ready.wait_on(cs);
  auto download_chunk = [&](size_t j) {
    const UpdateChunk& c = chunks[j];
    Slot& slot = *slots_[j % slots_.size()];
    copy_bytes_async(slot.grad.data(), Device::cpu(), updates[c.update].grad + c.begin, dev_,
                     size_t(c.end - c.begin) * sizeof(float), cs);
    slot.downloaded.record(cs);
  };
  for (size_t j = 0; j < std::min(chunks.size(), slots_.size()); ++j) download_chunk(j);
  for (size_t j = 0; j < chunks.size(); ++j) {
    const UpdateChunk& c = chunks[j];
    Slot& slot = *slots_[j % slots_.size()];
    // Also orders this slot's previous upload (queued before the download) before the CPU writes
    // new weights into it.
    slot.downloaded.synchronize();
    char* out = static_cast<char*>(updates[c.update].weights_out) + size_t(c.begin) * esz;
    if (weights_on_host_) {  // the parameter tier: the new weights go straight into their host shard
      body(j, slot.grad.data<float>(), out, false);
    } else {
      body(j, slot.grad.data<float>(), slot.weights.data(), true);
      copy_bytes_async(out, dev_, slot.weights.data(), Device::cpu(), size_t(c.end - c.begin) * esz, cs);
      slot.uploaded.record(cs);
    }
    if (j + slots_.size() < chunks.size()) download_chunk(j + slots_.size());
  }
  // The last upload is the last thing on the copy stream: the compute stream waits for it. Weights
  // written on the host are complete now, and every download was waited for.
  if (!weights_on_host_) slots_[(chunks.size() - 1) % slots_.size()]->uploaded.wait_on(s);
}

void StagingRing::download(const void* src, int64_t n, StreamHandle s,
                           const std::function<void(const void*, int64_t, int64_t)>& use) {
  const size_t esz = dtype_size(dt_);
  if (!slots_.empty()) copy_->synchronize();  // the slot is free
  for (int64_t off = 0; off < n; off += chunk_) {
    const int64_t count = std::min(chunk_, n - off);
    const void* at = static_cast<const char*>(src) + size_t(off) * esz;
    if (slots_.empty()) {
      use(at, off, count);
      continue;
    }
    void* stage = slots_[0]->weights.data();
    copy_bytes(stage, Device::cpu(), at, dev_, size_t(count) * esz, s);
    stream_synchronize(s);
    use(stage, off, count);
  }
}

void StagingRing::upload(void* dst, int64_t n, StreamHandle s,
                         const std::function<void(void*, int64_t, int64_t)>& fill) {
  const size_t esz = dtype_size(dt_);
  if (!slots_.empty()) copy_->synchronize();  // the slot is free
  for (int64_t off = 0; off < n; off += chunk_) {
    const int64_t count = std::min(chunk_, n - off);
    void* at = static_cast<char*>(dst) + size_t(off) * esz;
    if (slots_.empty()) {
      fill(at, off, count);
      continue;
    }
    void* stage = slots_[0]->weights.data();
    fill(stage, off, count);
    copy_bytes(at, dev_, stage, Device::cpu(), size_t(count) * esz, s);
    stream_synchronize(s);  // before the next piece overwrites the staging slot
  }
}

}  // namespace zp::parallel
