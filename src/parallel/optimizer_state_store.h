// Where AdamW's per-range state lives (DESIGN decisions 4 and 12): the fp32 master weights and the two
// moments of every owned range, behind one interface so that the tier is a choice of store, not a
// property of the optimizer. The store also applies the update, because that is where the tiers
// differ: the device store runs the fused multi-tensor kernel on the state in place, the host store
// (host_state_store.h) stages the gradients down, runs the update on the CPU and stages the new
// weights up, the NVMe store (nvme_state_store.h) additionally reads the state in and writes it
// back. Gradients and new weights are always in the block's device memory, where the engine keeps
// them; only the state moves.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "kernels/adamw.h"
#include "nn/parameter.h"
#include "parallel/adamw_hyper.h"
#include "parallel/sharding_policy.h"

namespace zp::parallel {

// A rank's range [begin, end) of a block's padded flat buffer (the whole buffer when unsharded).
// Ranges are split at parameter boundaries for the update, because weight decay is per parameter;
// alignment gaps inside a range are kept but never updated.
struct OwnedRange {
  nn::ParamBlock* block = nullptr;
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// The three fp32 tensors AdamW keeps per range (a checkpoint's /model and /optimizer datasets).
enum class OptimizerState { Master, ExpAvg, ExpAvgSq };

// One range's part of an update: its fp32 gradient (size() elements) and where its new weights go
// (size() elements of the block's dtype), both in the block's device memory.
struct RangeUpdate {
  size_t range = 0;
  const float* grad = nullptr;
  void* weights_out = nullptr;
};

class OptimizerStateStore {
 public:
  explicit OptimizerStateStore(std::vector<OwnedRange> ranges) : ranges_(std::move(ranges)) {}
  virtual ~OptimizerStateStore() = default;
  OptimizerStateStore(const OptimizerStateStore&) = delete;
  OptimizerStateStore& operator=(const OptimizerStateStore&) = delete;

  virtual StateTier tier() const = 0;
  const std::vector<OwnedRange>& ranges() const { return ranges_; }

  // One AdamW update of the listed ranges (kernels/adamw.h: `cfg` carries the step, the learning
  // rate and the gradient scale; `h` the per-parameter weight decay), ordered on stream `s`.
  virtual void update(std::span<const RangeUpdate> updates, const AdamWHyper& h, const kernels::AdamWConfig& cfg,
                      StreamHandle s) = 0;
  // Range i's `which` state, elements [offset, offset + count) of the range, copied to or from host
  // memory; `host` may be reused as soon as the call returns. For checkpoints and tools, not the step.
  virtual void read(size_t i, OptimizerState which, int64_t offset, int64_t count, float* host, StreamHandle s) = 0;
  virtual void write(size_t i, OptimizerState which, int64_t offset, int64_t count, const float* host,
                     StreamHandle s) = 0;
  // Casts range i's master weights into `weights_out` (size() elements of the block's dtype, device
  // memory), ordered on `s`: the compute weights after the master weights were loaded.
  virtual void write_weights(size_t i, void* weights_out, StreamHandle s) = 0;

 protected:
  std::vector<OwnedRange> ranges_;
};

// Where a new store's master weights start: initial(i) points at range i's current compute values
// (the block's dtype, size() elements, device memory, or host memory for the parameter tier's shards).
// A store asks for each range once, in order, and reads the values before it asks for the next, or
// enqueues the reading on its stream: the provider waits for that work before it reuses the memory
// (at the next call, and the store's owner after the constructor), so the values may pass through
// one buffer (the NVMe parameter tier's).
using InitialValues = std::function<const void*(size_t i)>;
// The provider for values that are all in memory at once.
InitialValues initial_values_at(std::vector<const void*> pointers);

// The store for the policy's optimizer tier (pinned or pageable host memory as it says; the NVMe
// tier's directory and I/O settings from policy.optimizer_nvme()). The master weights start from
// `initial`, the moments at zero.
std::unique_ptr<OptimizerStateStore> make_optimizer_state_store(const ShardingPolicy& policy,
                                                                std::vector<OwnedRange> ranges,
                                                                const InitialValues& initial, StreamHandle s);

}  // namespace zp::parallel
