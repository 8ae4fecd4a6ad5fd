#include "parallel/optimizer_state_store.h"

#include <algorithm>

#include "parallel/device_state_store.h"
#include "parallel/host_state_store.h"
#include "parallel/nvme_state_store.h"
#include "parallel/split_state_store.h"

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
  auto make = [&](StateTier tier, std::vector<OwnedRange> part,
                  const InitialValues& values) -> std::unique_ptr<OptimizerStateStore> {
    switch (tier) {
      case StateTier::Device: return std::make_unique<DeviceStateStore>(std::move(part), values, s);
      case StateTier::PinnedHost:
        return std::make_unique<HostStateStore>(std::move(part), values, s, policy.pin_host_memory(),
                                                policy.optimizer_threads(), HostStateStore::kBuffers,
                                                weights_on_host);
      case StateTier::Nvme:
        return std::make_unique<NvmeStateStore>(std::move(part), values, s, policy.optimizer_nvme(),
                                                policy.pin_host_memory(), policy.optimizer_threads(),
                                                weights_on_host);
    }
    ZP_FATAL("unknown optimizer tier");
  };
  std::vector<int64_t> sizes;
  for (const OwnedRange& r : ranges) sizes.push_back(r.size());
  const std::vector<char> on_device = policy.keeps_on_device(sizes);
  const size_t kept = size_t(std::count(on_device.begin(), on_device.end(), char(1)));
  if (kept == 0 || kept == ranges.size())  // one tier holds everything
    return make(kept == 0 ? policy.optimizer_tier() : StateTier::Device, std::move(ranges), initial);
  return std::make_unique<SplitStateStore>(std::move(ranges), on_device, policy.optimizer_tier(), initial, make);
}

}  // namespace zp::parallel
