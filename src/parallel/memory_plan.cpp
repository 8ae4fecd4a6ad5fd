#include "parallel/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "parallel/delayed_update.h"
#include "parallel/host_state_store.h"
#include "parallel/nvme_parameter_shards.h"
#include "parallel/nvme_state_store.h"

namespace zp::parallel {

MemoryPlan plan_memory(std::span<nn::ParamBlock* const> blocks, const ShardingPolicy& policy, int world,
                       bool step_in_backward, bool gpu) {
  MemoryPlan p;
  p.stage = policy.stage();
  p.world = world;
  // Frozen blocks (a LoRA run's base) hold compute weights only: no gradients, no optimizer state.
  int64_t largest = 0, largest_trained = 0;
  DType dt = DType::BF16;
  const bool on_gpu = gpu;
  for (const nn::ParamBlock* b : blocks) {
    p.params += b->padded();
    largest = std::max(largest, b->padded());
    if (!b->frozen()) {
      p.trainable_params += b->padded();
      largest_trained = std::max(largest_trained, b->padded());
    }
    dt = b->dtype();
  }
  const double psi = double(p.params), n = double(world), k = double(dtype_size(dt));
  const double psi_trained = double(p.trainable_params);
  // Stage 3 keeps the shards plus up to two gathered blocks in flight (the current and the prefetch),
  // or every block gathered once in the step when it keeps them.
  const double shards = policy.shards_parameters() ? psi / n : psi;
  const double in_flight = !policy.shards_parameters() ? 0.0 : policy.keeps_gathered() ? psi : 2.0 * double(largest);
  // Host shards exist only for GPU blocks: on a CPU device the device is host memory already. Shards
  // on NVMe leave the device (or a CPU's memory) either way, for the swap file and its buffers.
  const bool params_on_host = on_gpu && policy.parameter_tier() == StateTier::PinnedHost;
  const bool params_on_nvme = policy.shards_parameters() && policy.parameter_tier() == StateTier::Nvme;
  p.param_bytes = ((params_on_host || params_on_nvme ? 0.0 : shards) + in_flight) * k;
  if (params_on_host) p.host_param_bytes = shards * k;
  if (params_on_nvme) {
    std::vector<int64_t> shard_bytes;
    for (const nn::ParamBlock* b : blocks) shard_bytes.push_back(b->padded() / world * int64_t(dtype_size(dt)));
    p.nvme_param_bytes = double(NvmeParameterShards::file_bytes_for(shard_bytes));
    p.nvme_param_path = policy.parameter_nvme().path;
    p.host_staging_bytes += double(NvmeParameterShards::buffer_bytes_for(largest / world * int64_t(dtype_size(dt)),
                                                                         policy.parameter_nvme().buffer_count));
  }
  // Stepping in the backward keeps no gradient shard, only the blocks in flight (no accumulation).
  const double grad_shards = step_in_backward ? 0.0 : psi_trained / n;
  p.grad_bytes = (policy.shards_gradients() ? grad_shards + 2.0 * double(largest_trained) : psi_trained) * 4.0;
  const double owned = policy.shards_optimizer_state() ? psi_trained / n : psi_trained;
  // The owned ranges as the engine makes them (a trained block's shard, or all of it), and which keep
  // their optimizer state on the device (all on the device tier; with offload_optimizer.ratio below 1
  // the leading share).
  std::vector<int64_t> ranges;
  for (const nn::ParamBlock* b : blocks)
    if (!b->frozen()) ranges.push_back(policy.shards_optimizer_state() ? b->padded() / world : b->padded());
  const std::vector<char> on_device = policy.keeps_on_device(ranges);
  std::vector<int64_t> offloaded;
  double kept = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (on_device[i]) kept += double(ranges[i]);
    else offloaded.push_back(ranges[i]);
  }
  p.optimizer_bytes = kept * 12.0;
  const int64_t largest_range = offloaded.empty() ? 0 : *std::max_element(offloaded.begin(), offloaded.end());
  if (!offloaded.empty() && policy.optimizer_tier() == StateTier::Nvme) {
    p.nvme_optimizer_bytes = double(NvmeStateStore::file_bytes(offloaded));
    p.nvme_path = policy.optimizer_nvme().path;
    p.host_staging_bytes +=
        double(NvmeStateStore::buffer_bytes_for(largest_range, dt, policy.optimizer_nvme().buffer_count, on_gpu));
  } else if (!offloaded.empty()) {
    for (int64_t r : offloaded) p.host_optimizer_bytes += double(r) * 12.0;
    if (on_gpu) p.host_staging_bytes += double(HostStateStore::staging_bytes_for(largest_range, dt));
  }
  if (policy.delays_update() && policy.optimizer_tier() != StateTier::Device) {
    p.delayed_update_bytes = double(DelayedUpdate::device_bytes_for(int64_t(owned), dt, params_on_host));
    p.host_delayed_update_bytes = double(DelayedUpdate::host_bytes_for(int64_t(owned), dt, params_on_host));
  }
  p.host_pinned = on_gpu && policy.pin_host_memory();
  return p;
}

std::string MemoryPlan::str() const {
  char buf[512];
  const double mib = double(1ull << 20);
  std::snprintf(buf, sizeof(buf),
                "memory plan (ZeRO stage %d, %d rank%s, per rank): parameters %.1f MiB + gradients %.1f MiB (fp32) + "
                "optimizer %.1f MiB (fp32 master and moments) = %.1f MiB for %.2fM parameters (the ZeRO paper's "
                "2Ψ + 2Ψ + 12Ψ/N, 16-bit gradients: %.1f MiB); activations come on top",
                stage, world, world == 1 ? "" : "s", param_bytes / mib, grad_bytes / mib, optimizer_bytes / mib,
                device_bytes() / mib, double(params) / 1e6, (4.0 * double(params) + 12.0 * double(params) / world) / mib);
  std::string s = buf;
  if (trainable_params != params) {
    std::snprintf(buf, sizeof(buf), "; %.2fM of them train (the rest are frozen: weights only)",
                  double(trainable_params) / 1e6);
    s += buf;
  }
  if (delayed_update_bytes > 0 || host_delayed_update_bytes > 0) {
    std::snprintf(buf, sizeof(buf), "; the delayed update's second gradient and weight buffers: %.1f MiB on the device "
                  "(counted above) + %.1f MiB in host memory (counted below)", delayed_update_bytes / mib,
                  host_delayed_update_bytes / mib);
    s += buf;
  }
  if (host_bytes() > 0) {
    std::snprintf(buf, sizeof(buf), "; offloaded to %s host memory: parameters %.1f MiB + optimizer %.1f MiB (fp32 "
                  "master and moments) + staging %.1f MiB%s", host_pinned ? "pinned" : "pageable", host_param_bytes / mib,
                  host_optimizer_bytes / mib, host_staging_bytes / mib,
                  host_delayed_update_bytes > 0 ? " + the delayed update's weights" : "");
    s += buf;
  }
  if (nvme_optimizer_bytes > 0) {
    std::snprintf(buf, sizeof(buf), "; on NVMe under %s: optimizer %.1f MiB (fp32 master and moments, the rank's "
                  "swap file; its host buffers are the staging above)", nvme_path.c_str(), nvme_optimizer_bytes / mib);
    s += buf;
  }
  if (nvme_param_bytes > 0) {
    std::snprintf(buf, sizeof(buf), "; on NVMe under %s: parameters %.1f MiB (the rank's shards of the compute "
                  "weights, its swap file; its host buffers are the staging above)", nvme_param_path.c_str(),
                  nvme_param_bytes / mib);
    s += buf;
  }
  return s;
}

}  // namespace zp::parallel
