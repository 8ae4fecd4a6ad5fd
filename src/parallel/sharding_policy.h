// What a data-parallel group shards and where each kind of state lives (DESIGN decisions 2, 4 and
// 12): the one place that says "ZeRO stage N", so the engine asks questions (shards_gradients()?)
// rather than comparing stage numbers. The stages nest as in the ZeRO paper: sharding parameters
// implies sharding gradients, which implies sharding the optimizer state.
//
// Tiers: optimizer state (fp32 master weights and AdamW moments) and, with sharded parameters, the
// owned parameter slices each live on one tier. Optimizer state may live on the device, in host
// memory (ZeRO-Offload) or on NVMe (ZeRO-Infinity); the parameter slices (stage 3) on the device, in
// host memory or on NVMe.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace zp::parallel {

enum class StateTier { Device, PinnedHost, Nvme };

// What an NVMe tier needs from the configuration: the directory of the swap files
// (zero_optimization.offload_optimizer.nvme_path or offload_param.nvme_path), its host buffers
// (.buffer_count) and the shape of its I/O (aio.block_size bytes per request, aio.queue_depth
// requests in flight). The parameter tier also takes offload_param.buffer_size, DeepSpeed's elements
// per buffer: a bound every shard must fit (0: none; the buffers are sized to the largest shard).
struct NvmeSettings {
  std::string path;
  int64_t block_size = int64_t(1) << 20;
  int queue_depth = 8;
  int buffer_count = 4;
  int64_t buffer_size = 0;
  // The option that named `path` and the one that set buffer_size, for messages.
  std::string path_key = "zero_optimization.offload_optimizer.nvme_path";
  std::string buffer_size_key = "zero_optimization.offload_param.buffer_size";
};

// "device", "pinned host memory", "NVMe": for messages.
const char* tier_name(StateTier t);

class ShardingPolicy {
 public:
  // Stage 0 on the device: every rank holds everything.
  ShardingPolicy() = default;
  // ZeRO stage 0-3, every state on the device.
  static ShardingPolicy zero_stage(int stage);
  // From the configuration: zero_optimization.stage and the DeepSpeed offload devices
  // (zero_optimization.offload_optimizer.device / offload_param.device: "none" | "cpu" | "nvme").
  // Impossible combinations (offloading parameters below stage 3, the optimizer at stage 0, an
  // unknown device) are errors naming the keys. Tiers that are not implemented are accepted here
  // and refused by require_implemented().
  static ShardingPolicy from_config(int stage, const std::string& offload_optimizer_device,
                                    const std::string& offload_param_device);

  int stage() const { return stage_; }
  // Each rank keeps fp32 master weights and moments only for its slice of every block (stage >= 1).
  bool shards_optimizer_state() const { return stage_ >= 1; }
  // A block's full gradient buffer exists only while its backward runs; it is reduce-scattered into
  // the owner's slice (stage >= 2). Otherwise gradients are replicated and all-reduced.
  bool shards_gradients() const { return stage_ >= 2; }
  // Each rank keeps only its slice of the compute weights; blocks are gathered for use (stage 3).
  bool shards_parameters() const { return stage_ >= 3; }
  // Every rank holds the full compute weights but updates only its slice of them, so the updated
  // slices are all-gathered after each update (stages 1 and 2).
  bool gathers_updated_weights() const { return shards_optimizer_state() && !shards_parameters(); }
  // Stage 3 (pipeline.keep_gathered): a block gathered in a step stays gathered until the weights
  // change (the update, a checkpoint load), so a step's M micro-batches gather it once instead of
  // M times in the forward and M in the backward; the device then holds the whole model's (the
  // stage's) compute weights, as at stage 2.
  bool keeps_gathered() const { return keep_gathered_ && shards_parameters(); }
  void set_keep_gathered(bool on) { keep_gathered_ = on; }

  StateTier optimizer_tier() const { return optimizer_tier_; }
  // The share of the optimizer state the offloaded tier takes (zero_optimization.offload_optimizer.ratio,
  // DeepSpeed's partial offload, ZeRO-Offload++'s "twin flow"; 1: all of it). The rest stays on the
  // device, where the GPU updates it while the CPU updates the offloaded part, so a step's exposed CPU
  // update shrinks with the ratio at the cost of (1 - ratio) x 12 bytes per owned parameter of GPU
  // memory. Only meaningful with an offloaded optimizer tier.
  double offload_ratio() const { return offload_ratio_; }
  void set_offload_ratio(double r);
  // Which of a rank's owned ranges (their sizes in elements, in the engine's order) keep their
  // optimizer state on the device: none with the optimizer wholly offloaded, all on the device tier,
  // and with a ratio below 1 the leading ranges that come nearest (1 - ratio) of the elements. The
  // leading ones, so that a store built from the two parts still asks for the initial values in order.
  std::vector<char> keeps_on_device(std::span<const int64_t> range_sizes) const;
  // Whether host-tier state is page-locked (DeepSpeed's pin_memory): pinned memory makes the copies
  // to and from the GPU asynchronous and full speed, but the kernel can never swap it out. When
  // pinning fails the stores fall back to pageable memory with a warning.
  bool pin_host_memory() const { return pin_host_memory_; }
  void set_pin_host_memory(bool on) { pin_host_memory_ = on; }
  // CPU threads a rank's host-tier work (the CPU AdamW) may use; 0: every hardware thread. A node's
  // ranks share its cores, so the runtime gives each its share.
  int host_threads() const { return host_threads_; }
  void set_host_threads(int n) { host_threads_ = n; }
  // The NVMe tier's settings, for optimizer_tier() == Nvme.
  const NvmeSettings& optimizer_nvme() const { return optimizer_nvme_; }
  void set_optimizer_nvme(NvmeSettings s) { optimizer_nvme_ = std::move(s); }
  StateTier parameter_tier() const { return parameter_tier_; }
  // The parameter tier's NVMe settings, for parameter_tier() == Nvme (path_key
  // zero_optimization.offload_param.nvme_path).
  const NvmeSettings& parameter_nvme() const { return parameter_nvme_; }
  void set_parameter_nvme(NvmeSettings s) { parameter_nvme_ = std::move(s); }
  // The one-step delayed parameter update (zero_optimization.offload_optimizer.delayed_update, the
  // ZeRO-Offload paper's DPU; parallel/delayed_update.h): the CPU update of step s runs on a host thread
  // while step s+1 computes with the weights of update s-1. Only where the update runs on the CPU.
  bool delays_update() const { return delayed_update_; }
  void set_delayed_update(bool on) { delayed_update_ = on; }
  // Threads for the CPU AdamW's pool: host_threads(), less one with the delayed update, whose pool
  // runs while the rank's own thread drives the forward and backward (0: every hardware thread, or
  // every one but one).
  int optimizer_threads() const;
  // Throws a zp::Error naming the configuration keys for combinations the engine does not run: the
  // delayed update without an offloaded optimizer, with the parameters on NVMe (its lagging weights
  // would need a second copy of every shard beside the swap file) or with part of the optimizer state
  // on the device (offload ratio below 1: the delayed update runs the whole update on a host thread).
  void require_implemented() const;

  // "ZeRO stage 2 (optimizer state and gradients sharded; optimizer state on device)": for logs.
  std::string str() const;

 private:
  int stage_ = 0;
  StateTier optimizer_tier_ = StateTier::Device, parameter_tier_ = StateTier::Device;
  bool pin_host_memory_ = true;
  int host_threads_ = 0;
  bool delayed_update_ = false;
  bool keep_gathered_ = false;
  double offload_ratio_ = 1.0;
  NvmeSettings optimizer_nvme_, parameter_nvme_;
};

}  // namespace zp::parallel
