// Optimizer state in host memory (ZeRO-Offload's CPU tier, DESIGN decision 4): a rank's fp32 master
// weights and AdamW moments live in (pinned) host memory, and the update runs on the CPU.
//
// The trick is the staging ring (parallel/host_update.h, shared with the NVMe tier). A step walks the
// owned ranges in chunks of at most kChunk elements (the AdamW table splits them at parameter
// boundaries: weight decay is per parameter) through `buffer_count` pinned slots, each holding one
// chunk's fp32 gradients and its new compute-dtype weights. A copy stream brings chunk j+K's
// gradients down while the CPU updates chunk j and chunk j-1's weights go back up, so the PCIe
// traffic both ways hides behind the CPU update, and host memory for staging stays at K chunks
// however large the model. The compute stream waits for the last upload and nothing else: the host
// thread is busy for the CPU update only. On a CPU device the gradients and weights already are host
// memory and the update runs on them directly, with no staging.
#pragma once
#include <algorithm>
#include <memory>
#include <vector>

#include "core/device.h"
#include "kernels/host/host_adamw.h"
#include "parallel/host_update.h"
#include "parallel/optimizer_state_store.h"

namespace zp::parallel {

class HostStateStore final : public OptimizerStateStore {
 public:
  static constexpr int64_t kChunk = int64_t(1) << 22;  // elements per staging slot (16 MiB of fp32 gradients)
  static constexpr int kBuffers = 4;                    // staging slots by default
  // The staging ring's host bytes for ranges of at most `largest` elements of `dt`.
  static size_t staging_bytes_for(int64_t largest, DType dt, int buffer_count = kBuffers) {
    return size_t(buffer_count) * size_t(std::min(kChunk, largest)) * (sizeof(float) + dtype_size(dt));
  }

  // pinned: page-locked state (falls back to pageable memory, with one warning, when pinning fails);
  // threads: the CPU AdamW's (0: every hardware thread); buffer_count: staging slots (>= 1; 2 already
  // overlaps the copies with the update); weights_on_host: the ranges' compute weights (RangeUpdate's
  // weights_out) are host memory, the parameter tier's shards, so the update writes them in place
  // and nothing goes up.
  HostStateStore(std::vector<OwnedRange> ranges, const InitialValues& initial, StreamHandle s,
                 bool pinned, int threads = 0, int buffer_count = kBuffers, bool weights_on_host = false);

  StateTier tier() const override { return StateTier::PinnedHost; }
  bool pinned() const { return pinned_; }
  // Host bytes of state (fp32 master weights and moments) and of staging.
  size_t state_bytes() const;
  size_t staging_bytes() const;

  void update(std::span<const RangeUpdate> updates, const AdamWHyper& h, const kernels::AdamWConfig& cfg,
              StreamHandle s) override;
  void read(size_t i, OptimizerState which, int64_t offset, int64_t count, float* host, StreamHandle s) override;
  void write(size_t i, OptimizerState which, int64_t offset, int64_t count, const float* host,
             StreamHandle s) override;
  void write_weights(size_t i, void* weights_out, StreamHandle s) override;

 private:
  float* state(size_t i, OptimizerState which);
  StateSpan span(size_t range, int64_t begin);

  Device dev_;
  DType dt_;
  bool pinned_ = true;
  bool weights_on_host_ = false;
  std::vector<Tensor> master_, m_, v_;  // host memory, one per range
  std::unique_ptr<StagingRing> ring_;
  std::vector<kernels::AdamWTensor> table_;
  kernels::host::HostAdamW adamw_;  // vectorised, its threads kept for the store's life
};

}  // namespace zp::parallel
