// Optimizer state split between two tiers (zero_optimization.offload_optimizer.ratio below 1,
// DeepSpeed's partial offload): the leading owned ranges keep their state on the device, the rest on
// the offloaded tier (host memory or NVMe). A step hands the device part to the GPU first, which
// updates it asynchronously on the stream, then runs the CPU's part, so the two updates overlap and
// the step's exposed CPU time is the offloaded share's. Checkpoints and tools see one store: range i
// is the engine's range i whichever part holds it.
#pragma once
#include <memory>
#include <vector>

#include "parallel/optimizer_state_store.h"

namespace zp::parallel {

class SplitStateStore final : public OptimizerStateStore {
 public:
  // `on_device[i]`: whether range i is the device part's (ShardingPolicy::keeps_on_device). The parts
  // come from make_part(ranges, initial) for the device tier and for `offloaded`, in range order.
  using MakePart = std::function<std::unique_ptr<OptimizerStateStore>(StateTier tier, std::vector<OwnedRange> ranges,
                                                                      const InitialValues& initial)>;
  SplitStateStore(std::vector<OwnedRange> ranges, const std::vector<char>& on_device, StateTier offloaded,
                  const InitialValues& initial, const MakePart& make_part);

  // The offloaded tier's: what the ratio moves off the device.
  StateTier tier() const override { return offloaded_->tier(); }
  const OptimizerStateStore& device_part() const { return *device_; }
  const OptimizerStateStore& offloaded_part() const { return *offloaded_; }

  void update(std::span<const RangeUpdate> updates, const AdamWHyper& h, const kernels::AdamWConfig& cfg,
              StreamHandle s) override;
  void read(size_t i, OptimizerState which, int64_t offset, int64_t count, float* host, StreamHandle s) override;
  void write(size_t i, OptimizerState which, int64_t offset, int64_t count, const float* host,
             StreamHandle s) override;
  void write_weights(size_t i, void* weights_out, StreamHandle s) override;

 private:
  // Range i's part and its index there.
  std::pair<OptimizerStateStore*, size_t> part_of(size_t i);

  std::unique_ptr<OptimizerStateStore> device_, offloaded_;
  std::vector<char> on_device_;
  std::vector<size_t> local_;                      // range i's index in its part
  std::vector<RangeUpdate> device_ups_, host_ups_;  // reused by update()
};

}  // namespace zp::parallel
