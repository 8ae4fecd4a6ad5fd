#include "parallel/sharding_policy.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "core/error.h"

namespace zp::parallel {

namespace {

constexpr const char* kOptimizerKey = "zero_optimization.offload_optimizer.device";
constexpr const char* kParamKey = "zero_optimization.offload_param.device";

StateTier tier_of(const std::string& device, const char* key) {
  if (device == "none") return StateTier::Device;
  if (device == "cpu") return StateTier::PinnedHost;
  if (device == "nvme") return StateTier::Nvme;
  throw Error(detail::cat(key, " = \"", device, "\": expected \"none\", \"cpu\" or \"nvme\""));
}

// The configuration value that asks for `t` (the inverse of tier_of).
const char* device_of(StateTier t) {
  switch (t) {
    case StateTier::Device: return "none";
    case StateTier::PinnedHost: return "cpu";
    case StateTier::Nvme: return "nvme";
  }
  return "?";
}

}  // namespace

const char* tier_name(StateTier t) {
  switch (t) {
    case StateTier::Device: return "device";
    case StateTier::PinnedHost: return "pinned host memory";
    case StateTier::Nvme: return "NVMe";
  }
  return "?";
}

ShardingPolicy ShardingPolicy::zero_stage(int stage) {
  ZP_REQUIRE(stage >= 0 && stage <= 3, "zero_optimization.stage must be 0, 1, 2 or 3, got ", stage);
  ShardingPolicy p;
  p.stage_ = stage;
  return p;
}

ShardingPolicy ShardingPolicy::from_config(int stage, const std::string& offload_optimizer_device,
                                           const std::string& offload_param_device) {
  ShardingPolicy p = zero_stage(stage);
  p.optimizer_tier_ = tier_of(offload_optimizer_device, kOptimizerKey);
  p.parameter_tier_ = tier_of(offload_param_device, kParamKey);
  ZP_REQUIRE(p.optimizer_tier_ == StateTier::Device || p.shards_optimizer_state(), kOptimizerKey, " = \"",
             offload_optimizer_device, "\" needs zero_optimization.stage 1, 2 or 3 (stage 0 keeps no optimizer shard)");
  ZP_REQUIRE(p.parameter_tier_ == StateTier::Device || p.shards_parameters(), kParamKey, " = \"",
             offload_param_device, "\" needs zero_optimization.stage 3 (only stage 3 shards the parameters), got stage ",
             stage);
  return p;
}

void ShardingPolicy::set_offload_ratio(double r) {
  ZP_REQUIRE(r >= 0.0 && r <= 1.0, "zero_optimization.offload_optimizer.ratio must be in [0, 1], got ", r);
  offload_ratio_ = r;
}

std::vector<char> ShardingPolicy::keeps_on_device(std::span<const int64_t> range_sizes) const {
  if (optimizer_tier_ == StateTier::Device) return std::vector<char>(range_sizes.size(), 1);
  std::vector<char> on_device(range_sizes.size(), 0);
  double total = 0;
  for (int64_t n : range_sizes) total += double(n);
  const double want = (1.0 - offload_ratio_) * total;
  // A range stays while the device's share comes nearer `want` with it than without it.
  double kept = 0;
  for (size_t i = 0; i < range_sizes.size(); ++i) {
    if (kept + 0.5 * double(range_sizes[i]) >= want) break;
    on_device[i] = 1;
    kept += double(range_sizes[i]);
  }
  return on_device;
}

int ShardingPolicy::optimizer_threads() const {
  if (!delayed_update_) return host_threads_;
  const int all = host_threads_ > 0 ? host_threads_ : int(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, all - 1);
}

void ShardingPolicy::require_implemented() const {
  ZP_REQUIRE(!delayed_update_ || optimizer_tier_ != StateTier::Device,
             "zero_optimization.offload_optimizer.delayed_update needs ", kOptimizerKey,
             " = \"cpu\" or \"nvme\" (the update it delays is the CPU's), got \"", device_of(optimizer_tier_), "\"");
  ZP_REQUIRE(!delayed_update_ || offload_ratio_ == 1.0,
             "zero_optimization.offload_optimizer.delayed_update needs zero_optimization.offload_optimizer.ratio 1 "
             "(the delayed update runs the whole update on a host thread, so none of the optimizer state may stay on "
             "the device), got ratio ", offload_ratio_);
  ZP_REQUIRE(!delayed_update_ || parameter_tier_ != StateTier::Nvme,
             "zero_optimization.offload_optimizer.delayed_update cannot be combined with ", kParamKey,
             " = \"nvme\": the delayed update keeps the compute weights of the update before in place beside the "
             "ones it installs, which the swap file does not hold (use offload_param.device = \"cpu\", or no "
             "delayed update)");
}

std::string ShardingPolicy::str() const {
  static const char* const sharded[4] = {"nothing sharded", "optimizer state sharded",
                                         "optimizer state and gradients sharded",
                                         "optimizer state, gradients and parameters sharded"};
  auto where = [&](StateTier t) {
    return t == StateTier::PinnedHost && !pin_host_memory_ ? std::string("pageable host memory") : tier_name(t);
  };
  std::string s = "ZeRO stage " + std::to_string(stage_) + " (" + sharded[stage_] + "; optimizer state on " +
                  where(optimizer_tier_);
  if (optimizer_tier_ != StateTier::Device && offload_ratio_ < 1.0) {
    char share[64];
    std::snprintf(share, sizeof share, " for %.0f%% of it, the rest on the device", 100.0 * offload_ratio_);
    s += share;
  }
  if (shards_parameters()) s += ", parameters on " + where(parameter_tier_);
  if (delayed_update_) s += ", update delayed one step";
  return s + ")";
}

}  // namespace zp::parallel
