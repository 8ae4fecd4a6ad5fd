// Optimizer state on NVMe (ZeRO-Infinity's NVMe tier, DESIGN decision 4): a rank's fp32 master
// weights and AdamW moments live in its swap file (io/nvme_swap_file.h), and the update runs on the
// CPU as in HostStateStore, so host memory holds `buffer_count` chunks of state instead of all of it.
//
// File layout: per range, its master weights, first and second moments, one after the other, each
// padded to the swap file's alignment, so that every chunk's three pieces are aligned requests.
// A step walks the ranges in chunks through `buffer_count` host buffers of three states each: chunk
// j+1's state is read ahead (up to buffer_count - 1 chunks ahead) and chunk j-1's written behind
// while the CPU updates chunk j. On a GPU block the gradients come down and the new weights go up
// through the same staging ring HostStateStore uses; the host thread is busy for the CPU update and
// the waits for the disk only. Checkpoint reads and writes go through the file a buffer at a time.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "io/nvme_swap_file.h"
#include "kernels/host/host_adamw.h"
#include "parallel/host_update.h"
#include "parallel/optimizer_state_store.h"

namespace zp::parallel {

class NvmeStateStore final : public OptimizerStateStore {
 public:
  static constexpr int64_t kChunk = int64_t(1) << 22;  // elements per buffer and state (16 MiB of fp32)

  // nvme: the directory, aio settings and buffer count (ShardingPolicy::optimizer_nvme()); pinned:
  // page-locked buffers for a GPU's copies; threads: the CPU AdamW's (0: every hardware thread);
  // weights_on_host: the compute weights are the parameter tier's host shards, written in place
  // (HostStateStore's); chunk: elements per buffer and state, a multiple of the swap file's
  // alignment in floats (tests use small ones to walk many chunks).
  NvmeStateStore(std::vector<OwnedRange> ranges, const InitialValues& initial, StreamHandle s,
                 const NvmeSettings& nvme, bool pinned, int threads = 0, bool weights_on_host = false,
                 int64_t chunk = kChunk);
  ~NvmeStateStore() override;

  // Bytes of the swap file for ranges of these sizes (elements): for start-up checks before any store exists.
  static int64_t file_bytes(const std::vector<int64_t>& range_sizes);
  // Host bytes of a store's buffers and staging ring for ranges of at most `largest` elements of
  // `dt` (the staging ring only for blocks on a GPU).
  static size_t buffer_bytes_for(int64_t largest, DType dt, int buffer_count, bool gpu, int64_t chunk = kChunk);

  StateTier tier() const override { return StateTier::Nvme; }
  // Bytes of state in the swap file, and host bytes of its buffers and the staging ring.
  size_t state_bytes() const;
  size_t buffer_bytes() const;
  bool pinned() const { return pinned_; }
  const std::string& path() const { return nvme_.path; }
  const io::NvmeSwapFile& file() const { return *file_; }

  void update(std::span<const RangeUpdate> updates, const AdamWHyper& h, const kernels::AdamWConfig& cfg,
              StreamHandle s) override;
  void read(size_t i, OptimizerState which, int64_t offset, int64_t count, float* host, StreamHandle s) override;
  void write(size_t i, OptimizerState which, int64_t offset, int64_t count, const float* host,
             StreamHandle s) override;
  void write_weights(size_t i, void* weights_out, StreamHandle s) override;

 private:
  // A host buffer of chunk_ elements of each state, aligned for O_DIRECT, with the tickets of the
  // reads and writes in flight into and out of it.
  struct Buffer {
    Tensor memory;
    float* state[3] = {nullptr, nullptr, nullptr};
    io::NvmeSwapFile::Ticket reads[3] = {0, 0, 0}, writes[3] = {0, 0, 0};
  };
  // Byte offset in the file of element `element` of range i's `which` state (a multiple of the
  // alignment when `element` is a multiple of chunk_ or of the alignment in floats).
  int64_t offset_of(size_t i, OptimizerState which, int64_t element) const;
  void start_reads(Buffer& b, size_t range, int64_t begin, int64_t end);
  void start_writes(Buffer& b, size_t range, int64_t begin, int64_t end);
  static void wait(io::NvmeSwapFile& f, io::NvmeSwapFile::Ticket (&tickets)[3]);
  // After a failure: lets every request in flight end before the buffers may be reused or freed.
  void drain() noexcept;
  // Elements [offset, offset + count) of range i's `which` state, a buffer-sized aligned piece at a
  // time: visit(piece, first, n) sees the piece's elements from `first` in buffer memory. write:
  // the pieces go back to the file after visit (read first where only a part of one changes).
  void through_buffer(size_t i, OptimizerState which, int64_t offset, int64_t count, bool write,
                      const std::function<void(float* piece, int64_t first, int64_t n)>& visit);

  NvmeSettings nvme_;
  Device dev_;
  DType dt_;
  bool pinned_ = true;
  int64_t chunk_ = kChunk;
  std::vector<int64_t> base_;      // byte offset of each range's state in the file
  std::vector<int64_t> padded_;    // bytes of each of a range's three states, padded
  std::vector<Buffer> buffers_;    // declared before file_: freed only after its requests ended
  std::unique_ptr<io::NvmeSwapFile> file_;
  std::unique_ptr<StagingRing> ring_;
  std::vector<kernels::AdamWTensor> table_;
  kernels::host::HostAdamW adamw_;
};

}  // namespace zp::parallel
