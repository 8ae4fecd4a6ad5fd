#include "parallel/optimizer_state_store.h"

#include "parallel/device_state_store.h"
#include "parallel/host_state_store.h"
#include "parallel/nvme_state_store.h"

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
                                              policy.optimizer_threads(), HostStateStore::kBuffers,
                                              /*weights_on_host=*/policy.parameter_tier() == StateTier::PinnedHost);
    case StateTier::Nvme:
      return std::make_unique<NvmeStateStore>(std::move(ranges), initial, s, policy.optimizer_nvme(),
                                              policy.pin_host_memory(), policy.optimizer_threads(),
                                              /*weights_on_host=*/policy.parameter_tier() == StateTier::PinnedHost);
  }
  ZP_FATAL("unknown optimizer tier");
}

}  // namespace zp::parallel
