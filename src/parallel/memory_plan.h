// What a rank's model states cost on each tier, from the blocks' layout and the sharding policy
// alone: the ZeRO paper's 2Ψ (16-bit parameters) + 4Ψ (fp32 gradients here) + 12Ψ (fp32 master
// weights and AdamW moments), each divided by N where the policy shards it, placed on the device or
// in host memory or on NVMe as the policy's tiers say, plus the buffers the engine adds (stage 3's
// gathered blocks in flight, the offload tiers' staging ring and NVMe buffers). A frozen block (LoRA's
// base) counts its compute weights only. Laid-out blocks suffice (nothing is
// allocated), so the same numbers serve `zeropipe plan`, the start-up fit check and the banner.
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include "nn/parameter.h"
#include "parallel/sharding_policy.h"

namespace zp::parallel {

struct MemoryPlan {
  int stage = 0, world = 1;
  int64_t params = 0;  // Ψ: parameters (all blocks, padded)
  int64_t trainable_params = 0;  // those of blocks that are not frozen: the gradients' and optimizer's Ψ
  // Per rank, resident on the device.
  double param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
  // Per rank, in host memory (the offload tiers): parameter shards, optimizer state, staging.
  double host_param_bytes = 0, host_optimizer_bytes = 0, host_staging_bytes = 0;
  bool host_pinned = false;
  // Per rank, in its swap files under the nvme_paths (the NVMe tiers of the optimizer state and of
  // the parameter shards); their host buffers count in host_staging_bytes.
  double nvme_optimizer_bytes = 0, nvme_param_bytes = 0;
  std::string nvme_path, nvme_param_path;
  // Per rank, the delayed update's double buffers (parallel/delayed_update.h): a copy of the owned
  // fp32 gradients and of the owned compute weights, on the device (the weights in host memory
  // where the parameter tier keeps the shards there).
  double delayed_update_bytes = 0, host_delayed_update_bytes = 0;

  double device_bytes() const { return param_bytes + grad_bytes + optimizer_bytes + delayed_update_bytes; }
  double nvme_bytes() const { return nvme_optimizer_bytes + nvme_param_bytes; }
  double host_bytes() const {
    return host_param_bytes + host_optimizer_bytes + host_staging_bytes + host_delayed_update_bytes;
  }
  // The banner's line: "memory plan (ZeRO stage 3, 2 ranks, per rank): parameters ... ".
  std::string str() const;
};

// The plan of `blocks` (laid out or allocated) under `policy` on `world` ranks, for training on GPUs
// (`gpu`; on CPUs the host tiers are the device's own memory and need no staging). step_in_backward:
// no gradient shard is kept (the update runs as each block's gradients are final).
MemoryPlan plan_memory(std::span<nn::ParamBlock* const> blocks, const ShardingPolicy& policy, int world,
                       bool step_in_backward, bool gpu);

}  // namespace zp::parallel
