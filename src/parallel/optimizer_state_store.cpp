#include "parallel/optimizer_state_store.h"

#include "parallel/device_state_store.h"
#include "parallel/host_state_store.h"
#include "parallel/nvme_state_store.h"

namespace zp::parallel {

InitialValues initial_values_at(std::vector<const void*> pointers) {
  return [p = std::move(pointers)](size_t i) {
    ZP_CHECK(i < p.size(), "initial values of range ", i, " of ", p.size());
    return p[i];
  };
}

std::unique_ptr<OptimizerStateStore> make_optimizer_state_store(const ShardingPolicy& policy,
                                                                std::vector<OwnedRange> ranges,
                                                                const InitialValues& initial, StreamHandle s) {
  // With the parameter tier (host memory or NVMe buffers) the weights the update writes are host memory.
  const bool weights_on_host = policy.shards_parameters() && policy.parameter_tier() != StateTier::Device;
  switch (policy.optimizer_tier()) {
    case StateTier::Device: return std::make_unique<DeviceStateStore>(std::move(ranges), initial, s);
    case StateTier::PinnedHost:
      return std::make_unique<HostStateStore>(std::move(ranges), initial, s, policy.pin_host_memory(),
                                              policy.optimizer_threads(), HostStateStore::kBuffers,
                                              weights_on_host);
    case StateTier::Nvme:
      return std::make_unique<NvmeStateStore>(std::move(ranges), initial, s, policy.optimizer_nvme(),
                                              policy.pin_host_memory(), policy.optimizer_threads(),
                                              weights_on_host);
  }
  ZP_FATAL("unknown optimizer tier");
}

}  // namespace zp::parallel
