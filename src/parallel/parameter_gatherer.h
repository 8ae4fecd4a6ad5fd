// ZeRO-3's parameter side (DESIGN decision 2): each rank keeps only its contiguous 1/N slice of every
// block's compute weights; acquiring a block all-gathers it into a temporary full buffer bound to
// the block, and the last release frees it. The next block's gather is issued as soon as the
// current one is acquired, on the communication stream (so it overlaps the current block's
// compute), in the order blocks were acquired in the previous step; a prefetch is dropped when the
// weights change (drop_prefetches(): before an update, at the start of a step).
//
// The parameter tier (ZeRO-Infinity's offload_param, DESIGN decision 4): with the shards in host
// memory, a gather first copies this rank's shard up into its own place in the full buffer and then
// all-gathers in place, both on the communication stream, so the prefetch hides the PCIe copy too
// and the GPU holds only the blocks in flight. With the shards on NVMe (nvme_parameter_shards.h) a
// gather takes the shard from a staging buffer, which is read from the swap file ahead of use (the
// next buffer_count - 1 blocks in the learned order), and new weights go to the file through the
// same buffers (rewrite_shards()).
//
// It implements nn::BlockAccess's parameter half by itself, so a pipeline stage or an inference run
// can serve a model's forward from sharded weights without the rest of the ZeRO engine; the
// engine composes it with the gradient reducer and the optimizer.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "nn/block_access.h"
#include "parallel/collective_stream.h"
#include "parallel/nvme_parameter_shards.h"
#include "parallel/sharding_policy.h"

namespace zp::parallel {

class ParameterGatherer : public nn::BlockAccess {
 public:
  // `dp` may be nullptr (a single rank: acquiring copies the one shard). `comm` orders the gathers
  // and must outlive the gatherer. `tier`: where the shards of GPU blocks live (the device or pinned
  // host memory; `pinned` false or a refused pinning gives pageable memory), or of any blocks on
  // NVMe (the swap file and buffers as `nvme` says). CPU blocks keep in-memory shards in host memory.
  ParameterGatherer(comm::Communicator* dp, CollectiveStream& comm, StateTier tier = StateTier::Device,
                    bool pinned = true, const NvmeSettings& nvme = {});
  ~ParameterGatherer() override;

  // Shards `b`: keeps this rank's slice of its current values (bound, padded to a multiple of
  // shard_pad_multiple(world)) and unbinds the full buffer, which frees it. Blocks are numbered in
  // the order they are added.
  void add(nn::ParamBlock& b);
  // Shards `b` from this rank's slice alone (`slice`: elements [rank x n, (rank + 1) x n) of its
  // padded values, n = padded() / world, on the CPU or b's device), as sharded loading reads it: the
  // block's full buffer is never made. `slice` may be freed once this returns.
  void add_slice(nn::ParamBlock& b, const Tensor& slice);
  // This rank's slice of every block: [rank() x padded / world, ...).
  int rank() const { return rank_; }
  int world() const { return world_; }
  size_t size() const { return blocks_.size(); }
  // Block i's owned slice of the compute weights, in memory (not with the shards on NVMe).
  Tensor& shard(size_t i);
  // Block i's shard for reading, in memory or in an NVMe buffer: valid until the next call on the
  // gatherer, which first waits for the work enqueued on `s` (that reads it).
  const void* shard_data(size_t i, StreamHandle s);
  // New values for the shards of blocks `blocks` (indices in add order), through `fill(first, outs)`,
  // which writes the shard of blocks[first + j] at outs[j] (host memory when shards_on_host(), else
  // the device), ordered on `s`. In memory that is one call over all blocks, writing the shards in
  // place; on NVMe the blocks come in groups that fit the buffers, each written behind to the file
  // once `s` has finished it.
  using ShardFill = std::function<void(size_t first, std::span<void* const> outs)>;
  void rewrite_shards(std::span<const size_t> blocks, StreamHandle s, const ShardFill& fill);
  StateTier tier() const { return tier_; }
  // Whether GPU blocks' shards (or their NVMe buffers, which the optimizer writes) are in host memory,
  // and whether that memory is pinned.
  bool shards_on_host() const { return tier_ != StateTier::Device; }
  bool pinned() const { return pinned_; }
  // Bytes of the shards (on the tier), and of the NVMe tier's swap file and host buffers.
  size_t shard_bytes() const;
  size_t nvme_file_bytes() const { return nvme_ ? size_t(nvme_->file_bytes()) : 0; }
  size_t nvme_buffer_bytes() const { return nvme_ ? nvme_->buffer_bytes() : 0; }

  void acquire_params(nn::ParamBlock& b) override;
  void release_params(nn::ParamBlock& b) override;

  // The block order of the last step (forward, backward, any evaluation) predicts this one's.
  void begin_step();
  // With keep on, a block stays gathered after its last release until release_kept(), which the
  // owner calls when the weights change (ShardingPolicy::keeps_gathered).
  void set_keep_gathered(bool on) { keep_ = on; }
  void release_kept();
  // Waits (on the compute stream) for every gather in flight and frees its buffer.
  void drop_prefetches();

 private:
  struct Sharded {
    nn::ParamBlock* block;
    int64_t shard_size;                  // elements per rank
    Tensor shard;                        // the owned slice of the compute weights (in memory)
    size_t nvme_index = 0;               // its shard in nvme_ (on NVMe)
    int refs = 0;
    bool kept = false;                   // holds one of the refs (keep_)
    Tensor prefetched;                   // a full buffer being gathered on the comm stream
    std::shared_ptr<Event> prefetch_done;  // recorded on the comm stream after that gather
  };
  Sharded& of(nn::ParamBlock& b);
  void prefetch(Sharded& u);
  // Gathers u's full values into `full` on stream `cs`.
  void gather(Sharded& u, Tensor& full, StreamHandle cs);
  // Starts the NVMe reads of the blocks that came after u in the previous step, as many as the
  // buffers hold beside u's.
  void read_ahead(const Sharded& u);
  // Whether the next block is gathered ahead: on the communication stream, or for a single rank
  // with host shards on the upload stream (the copy up is then the whole gather).
  bool prefetches() const;
  comm::Communicator* dp_;
  CollectiveStream& comm_;
  StreamHandle s_;
  int world_ = 1, rank_ = 0;
  StateTier tier_ = StateTier::Device;
  bool pinned_ = true;
  NvmeSettings nvme_settings_;
  std::unique_ptr<NvmeParameterShards> nvme_;  // the NVMe tier, made at the first add()
  std::unique_ptr<Stream> upload_;        // with host shards on a GPU
  std::unique_ptr<Event> upload_ready_;   // the compute stream's point the upload stream waits for
  std::vector<Sharded> blocks_;
  std::vector<Sharded*> gather_order_, this_step_order_;
  size_t order_pos_ = 0;
  bool keep_ = false;
};

}  // namespace zp::parallel
