#include "parallel/optimizer_state_store.h"

#include "parallel/device_state_store.h"

namespace zp::parallel {

std::unique_ptr<OptimizerStateStore> make_optimizer_state_store(StateTier tier, std::vector<OwnedRange> ranges,
                                                                const std::vector<const void*>& initial,
                                                                StreamHandle s) {
  // The offload tiers plug in here (issue 11).
  ZP_REQUIRE(tier == StateTier::Device, "zero_optimization.offload_optimizer.device: optimizer state in ",
             tier_name(tier), " is not implemented yet");
  return std::make_unique<DeviceStateStore>(std::move(ranges), initial, s);
}

}  // namespace zp::parallel
