// Stage 3's parameter shards on NVMe (ZeRO-Infinity's offload_param.device = "nvme", DESIGN decision
// 4): a rank's slice of every block's compute weights lives in its swap file (io/nvme_swap_file.h),
// one aligned extent per block, and host memory holds only `buffer_count` staging buffers, each the
// size of the largest shard. The ParameterGatherer reads a shard into a buffer to gather its block
// (reading the next blocks ahead in the learned order) and the optimizer writes new weights into
// buffers, which go back to the file behind the next work.
//
// A buffer caches the shard it last held. Ordering, which keeps every read seeing the newest values:
// at most one buffer holds a shard; a shard is read from the file only when no buffer holds it; a
// buffer is reused (for another shard, or rewritten) only after its write to the file, its read from
// it and the GPU copies out of it have ended. So a read of a shard always follows its last write.
// Buffers are reused least recently used first.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "io/nvme_swap_file.h"
#include "parallel/sharding_policy.h"

namespace zp::parallel {

class NvmeParameterShards {
 public:
  // nvme: the directory (path_key names the option for messages), aio settings, buffer count and
  // the buffer_size bound; gpu: the blocks are on a GPU, so the buffers are pinned when `pinned`
  // (turned false where pinning is refused) and GPU copies out of them are waited for by event.
  NvmeParameterShards(const NvmeSettings& nvme, bool gpu, bool& pinned);
  ~NvmeParameterShards();  // waits for every request in flight

  // Appends block `name`'s shard of `elements` of `dt` and writes its current values, `src` on
  // `src_dev` (copied now; the caller may free it on return). The file grows by the shard's aligned
  // size. Returns its index.
  size_t add(const std::string& name, const void* src, Device src_dev, int64_t elements, DType dt, StreamHandle s);
  size_t size() const { return shards_.size(); }
  int64_t shard_bytes(size_t i) const { return shards_.at(i).bytes; }

  // Starts reading shard i into a buffer, unless a buffer holds it already.
  void read_ahead(size_t i);
  // Host memory holding shard i's current values (read now unless a buffer holds them), until
  // release(i): the buffer is not reused before.
  const void* take(size_t i);
  // Ends take(i); `s` (GPU runs) is the stream whose work enqueued so far reads the buffer.
  void release(size_t i, StreamHandle s);
  // A buffer for shard i's new values (all of them: it starts zeroed, the padding's value), until
  // commit(). At most buffer_count() shards at once.
  void* begin_write(size_t i);
  // Writes the buffers of begin_write() of `shards` to the file, behind the caller, once the work
  // enqueued on `s` (which fills them) has ended. The buffers keep the shards for later reads.
  void commit(std::span<const size_t> shards, StreamHandle s);
  // Waits for every write in flight (throws the first failure).
  void flush();

  int buffer_count() const { return int(buffers_.size()); }
  // Bytes of the swap file, and of the host buffers.
  int64_t file_bytes() const;
  size_t buffer_bytes() const;
  bool pinned() const { return pinned_; }
  // The swap file's size for shards of these sizes (bytes), and the host bytes of the buffers for a
  // largest shard of `largest` bytes: for plans and start-up checks before anything exists.
  static int64_t file_bytes_for(std::span<const int64_t> shard_bytes);
  static size_t buffer_bytes_for(int64_t largest, int buffer_count);

 private:
  struct Shard {
    int64_t offset = 0, bytes = 0;
  };
  struct Buffer {
    Tensor memory;                  // buffer_bytes_ + alignment slack
    char* at = nullptr;             // aligned for O_DIRECT
    int64_t shard = -1;             // the shard it holds (or is reading), -1: none
    io::NvmeSwapFile::Ticket reading = 0, writing = 0;
    bool held = false;              // between take() and release(), or begin_write() and commit()
    uint64_t last_use = 0;
    std::unique_ptr<Event> copied;  // GPU: recorded after the copies out of it
    bool copying = false;
  };
  Buffer* holding(size_t shard);
  // A buffer no one holds, least recently used, with all its work ended and no shard.
  Buffer& free_buffer();
  // Waits for the buffer's read, write and copies.
  void settle(Buffer& b);
  // Grows the buffers to `bytes` (start-up: each shard added may be the largest so far).
  void grow_buffers(int64_t bytes);

  NvmeSettings nvme_;
  bool gpu_ = false, pinned_ = false;
  int64_t buffer_bytes_ = 0;        // each buffer's usable size: the largest shard, aligned
  uint64_t clock_ = 0;
  std::vector<Shard> shards_;
  std::vector<Buffer> buffers_;     // declared before file_: freed only after its requests ended
  std::unique_ptr<io::NvmeSwapFile> file_;
};

}  // namespace zp::parallel
