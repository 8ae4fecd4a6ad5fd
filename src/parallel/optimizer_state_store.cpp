#include "parallel/optimizer_state_store.h"

#include "parallel/device_state_store.h"
#include "parallel/host_state_store.h"

namespace zp::parallel {

std::unique_ptr<OptimizerStateStore> make_optimizer_state_store(const ShardingPolicy& policy,
                                                                std::vector<OwnedRange> ranges,
                                                                const std::vector<const void*>& initial,
                                                                StreamHandle s) {
  switch (policy.optimizer_tier()) {
    case StateTier::Device: return std::make_unique<DeviceStateStore>(std::move(ranges), initial, s);
    case StateTier::PinnedHost:
      // With the parameter tier the weights the update writes are the host shards.
      return std::make_unique<HostStateStore>(std::move(ranges), initial, s, policy.pin_host_memory(),
                                              policy.host_threads(), HostStateStore::kBuffers,
                                              /*weights_on_host=*/policy.parameter_tier() == StateTier::PinnedHost);
    case StateTier::Nvme: break;
  }
  throw Error(detail::cat("zero_optimization.offload_optimizer.device: optimizer state in ",
                          tier_name(policy.optimizer_tier()), " is not implemented yet"));
}

}  // namespace zp::parallel
