// The data path of checkpoint files (io/checkpoint_file.h): a rank's bytes of a contiguous HDF5
// dataset moved with pwrite/pread at the dataset's address in the file, beside HDF5, which keeps
// writing and reading the metadata. Through HDF5 and MPI-IO the same bytes went through the page
// cache, in HDF5's pieces, with the CRC computed after each piece by the same thread: 29% of the
// disk's write bandwidth and 52% of its read bandwidth (zp_bench_io).
//
// Here the kernel moves whole 4 KiB pages with O_DIRECT, 32 MiB per request, between the disk and
// aligned bounce buffers: three requests are in flight while the caller copies the next piece into
// a fourth buffer and computes its CRC, so copy and checksum hide behind the disk, and reads keep
// three in flight the same way. One request at a time left a virtual disk idle between requests
// (loads at 0.82-0.90x a raw one-request-at-a-time read on a GPU host, 0.95x with three); saves with
// one write in flight beside the copy ran at 1.48-1.70 GB/s on a 2-core VM's disk, with both cores
// idle more than half the time, and at 1.92-2.00 GB/s with three (zp_bench_io, 1 rank, 3.65 GB). The
// partial pages at either end of a range (a rank's slice rarely starts on a page) go through the
// page cache: ranks share those pages, and only buffered writes of a shared page keep both ranks'
// bytes. sync() makes this rank's buffered bytes durable (every rank syncs its own, which is what a
// distributed file system needs). A file system that refuses O_DIRECT (tmpfs) gets buffered I/O
// throughout.
//
// Errors throw zp::Error naming the file, the byte range and the reason (ENOSPC included).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace zp::io {

class DirectFile {
 public:
  static constexpr int64_t kAlign = 4096;           // O_DIRECT's offset, size and address unit
  static constexpr int64_t kPieceBytes = 32 << 20;  // one request to the disk
  static constexpr int64_t kCacheBytes = 256 << 10;  // copied and checksummed while in the CPU's cache

  // Opens an existing file for reading, or also writing. write() copies and checksums with
  // `threads` threads (the caller's included): one core's CRC is slower than a fast disk.
  DirectFile(const std::string& path, bool writable, int threads = 1);
  ~DirectFile();
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;

  // Writes `bytes` from `data` at byte `offset` of the file; returns crc32(data) continuing `crc`.
  // `data` may be reused at once, but the last piece may still be on its way to the disk: a failure
  // to write it is thrown by the next write(), read_ranges() or sync().
  uint32_t write(int64_t offset, const void* data, int64_t bytes, uint32_t crc = 0);
  // Reads (offset, bytes) ranges in order, as one stream of pieces of at most kPieceBytes (a piece
  // never spans two ranges), so that the disk reads the next range's first pieces while the caller
  // consumes this one's last: consume(range index, piece, piece_bytes).
  void read_ranges(const std::vector<std::pair<int64_t, int64_t>>& ranges,
                   const std::function<void(size_t, const char*, int64_t)>& consume);
  // Waits for the writes in flight, then fsync: this rank's writes are on the disk.
  void sync();
  bool direct() const { return direct_fd_ >= 0; }

 private:
  void pwrite_all(int fd, const char* p, int64_t bytes, int64_t offset);
  void finish_writes();  // waits for the pieces still being written; throws the first failure
  std::string path_;
  int fd_ = -1, direct_fd_ = -1;
  int threads_ = 1;
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  // Reads and writes keep kPiecesInFlight pieces on their way to or from the disk while the caller
  // works on one more: a buffer each, allocated at first use.
  static constexpr int kPiecesInFlight = 3;
  static constexpr int kBuffers = kPiecesInFlight + 1;
  std::unique_ptr<char, Free> buffers_[kBuffers];
  char* piece_buffer(size_t k);  // piece k's buffer, k % kBuffers
  std::future<void> writing_[kBuffers];  // the piece being written from each buffer (the destructor waits)
  int next_write_ = 0;            // the buffer the next piece is copied into
};

}  // namespace zp::io
