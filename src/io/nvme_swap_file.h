// A rank's swap file on NVMe (ZeRO-Infinity's NVMe tier, DESIGN decision 4): one preallocated file
// under a configured directory, read and written asynchronously through io_uring with O_DIRECT, so
// that a store can read the next state ahead and write the last one behind while the CPU works.
//
// A request [offset, offset + bytes) is split into pieces of at most `block_size` bytes (DeepSpeed's
// aio.block_size); at most `queue_depth` pieces are in the kernel at once (aio.queue_depth), the rest
// wait in order. One I/O thread reaps completions and submits waiting pieces, so the disk stays busy
// while the caller computes; the caller holds a ticket per request and waits on it when it needs the
// data (or the buffer back). With O_DIRECT the kernel moves data straight between the disk and the
// caller's buffer, so offsets, sizes and buffer addresses must be multiples of kAlign.
//
// Failures (a full disk, an I/O error) surface at wait() as a zp::Error naming the configuration key,
// the directory, the offset and the bytes. Writes honour the fault injector (core/fault_injection.h)
// as a full disk would fail.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace zp::io {

class NvmeSwapFile {
 public:
  // O_DIRECT's alignment for offsets, sizes and buffers: the largest logical block size of common
  // devices (4Kn NVMe), which also satisfies 512-byte devices.
  static constexpr int64_t kAlign = 4096;
  using Ticket = uint64_t;

  // Creates a file named `name` in the existing directory `dir` and preallocates `bytes` (rounded up
  // to kAlign) so that a disk too small fails here, not mid-step. `key` is the configuration key that
  // named `dir`, for messages. A file system that refuses O_DIRECT gets buffered I/O and one warning.
  NvmeSwapFile(const std::string& dir, const std::string& key, const std::string& name, int64_t bytes,
               int64_t block_size, int queue_depth);
  ~NvmeSwapFile();  // waits for the requests in flight (their buffers may be freed after)
  NvmeSwapFile(const NvmeSwapFile&) = delete;
  NvmeSwapFile& operator=(const NvmeSwapFile&) = delete;

  // Starts a write of `bytes` from `src` (or a read into `dst`) at `offset`; the buffer must stay
  // untouched until the ticket is waited for.
  Ticket write(int64_t offset, const void* src, int64_t bytes);
  Ticket read(int64_t offset, void* dst, int64_t bytes);
  // Grows the file by `bytes` (rounded up to kAlign), preallocated as at creation (a disk too small
  // fails here, naming the bytes), and returns the offset of the new part. Callers that learn their
  // sizes one at a time (the parameter tier, block by block at start-up) append this way.
  int64_t extend(int64_t bytes);
  // Blocks until the request is complete; throws its failure. Each ticket is waited for at most once.
  void wait(Ticket t);
  // wait() for every request not yet waited for; throws the first failure after all have ended.
  void wait_all();

  const std::string& path() const;  // of the file, already unlinked
  int64_t size() const;             // preallocated bytes
  bool direct() const;              // O_DIRECT (false: buffered, the file system refused it)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zp::io
