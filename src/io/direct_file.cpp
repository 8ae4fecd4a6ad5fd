// The pipeline in write(): pieces k-2..k are with I/O threads (std::async tasks) while the caller
// copies and checksums piece k+1 into the fourth buffer; in read_ranges() pieces k+1..k+3 are being
// read while the caller consumes piece k. A buffer is reused only after the task that used it has
// been waited for.
// A read waits for its tasks before it returns or throws; a write returns with its last piece still
// being written, so that the next write's first piece is copied and checksummed meanwhile (most of a
// checkpoint's tensors are one or two pieces: draining the pipeline at every tensor left the disk
// idle for one piece's copy per tensor). sync() and the destructor wait for it.
#include "io/direct_file.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>
#include <vector>

#include "core/error.h"
#include "io/checkpoint_file.h"

namespace zp::io {

namespace {
int64_t align_down(int64_t v) { return v / DirectFile::kAlign * DirectFile::kAlign; }
int64_t align_up(int64_t v) { return align_down(v + DirectFile::kAlign - 1); }

// One piece's I/O buffer: kPieceBytes plus a page at either end (a piece's range rarely starts or
// ends on a page), page-aligned for O_DIRECT.
char* allocate_piece_buffer(const std::string& path) {
  constexpr int64_t page = DirectFile::kAlign, piece = DirectFile::kPieceBytes;
  void* p = nullptr;
  ZP_REQUIRE(posix_memalign(&p, size_t(page), size_t(piece + 2 * page)) == 0, path, ": cannot allocate ", piece,
             " bytes of I/O buffer");
  return static_cast<char*>(p);
}
}  // namespace

DirectFile::DirectFile(const std::string& path, bool writable, int threads)
    : path_(path), threads_(std::max(1, threads)) {
  const int mode = writable ? O_RDWR : O_RDONLY;
  fd_ = ::open(path.c_str(), mode | O_CLOEXEC);
  ZP_REQUIRE(fd_ >= 0, path, ": cannot open: ", std::strerror(errno));
  direct_fd_ = ::open(path.c_str(), mode | O_DIRECT | O_CLOEXEC);  // -1: the file system refuses O_DIRECT
}

DirectFile::~DirectFile() {
  for (auto& p : writing_)
    if (p.valid()) p.wait();  // a failure here was (or will never be) reported by write() or sync()
  if (fd_ >= 0) ::close(fd_);
  if (direct_fd_ >= 0) ::close(direct_fd_);
}

void DirectFile::pwrite_all(int fd, const char* p, int64_t bytes, int64_t offset) {
  for (int64_t done = 0; done < bytes;) {
    const ssize_t n = ::pwrite(fd, p + done, size_t(bytes - done), off_t(offset + done));
    if (n < 0 && errno == EINTR) continue;
    ZP_REQUIRE(n > 0, path_, ": write of bytes [", offset + done, ", ", offset + bytes, ") failed: ",
               n < 0 ? std::strerror(errno) : "nothing written");
    done += n;
  }
}

uint32_t DirectFile::write(int64_t offset, const void* data, int64_t bytes, uint32_t crc) {
  const char* src = static_cast<const char*>(data);
  const int64_t end = offset + bytes;
  // Whole pages in the middle go O_DIRECT through the bounce buffers, the partial ones at the ends
  // through the page cache.
  int64_t body = direct() ? std::min(end, align_up(offset)) : end, body_end = direct() ? align_down(end) : end;
  if (body >= body_end) body = body_end = end;
  crc = crc32(src, size_t(body - offset), crc);
  pwrite_all(fd_, src, body - offset, offset);
  for (int64_t at = body; at < body_end; at += kPieceBytes, next_write_ = (next_write_ + 1) % kBuffers) {
    const int k = next_write_;
    char* buf = piece_buffer(size_t(k));
    const int64_t n = std::min(kPieceBytes, body_end - at);
    if (writing_[k].valid()) writing_[k].get();
    // Bytes [from, to) of the piece copied and checksummed, in pieces the CRC finds in the cache.
    auto copy = [&, k](int64_t from, int64_t to) {
      uint32_t c = 0;
      for (int64_t b = from; b < to; b += kCacheBytes) {
        const size_t len = size_t(std::min(kCacheBytes, to - b));
        std::memcpy(buf + b, src + (at - offset) + b, len);
        c = crc32(buf + b, len, c);
      }
      return c;
    };
    // Split over the threads (the caller takes the first part); zlib combines the parts' CRCs.
    const int64_t part = (n + threads_ - 1) / threads_;
    std::vector<std::future<uint32_t>> parts;
    for (int64_t from = part; from < n; from += part)
      parts.push_back(std::async(std::launch::async, copy, from, std::min(n, from + part)));
    crc = uint32_t(::crc32_combine(crc, copy(0, std::min(n, part)), z_off_t(std::min(n, part))));
    for (size_t t = 0; t < parts.size(); ++t)
      crc = uint32_t(::crc32_combine(crc, parts[t].get(), z_off_t(std::min(n, part * int64_t(t + 2)) - part * int64_t(t + 1))));
    writing_[k] = std::async(std::launch::async, [this, buf, n, at] { pwrite_all(direct_fd_, buf, n, at); });
  }
  crc = crc32(src + (body_end - offset), size_t(end - body_end), crc);
  pwrite_all(fd_, src + (body_end - offset), end - body_end, body_end);
  return crc;
}

void DirectFile::read_ranges(const std::vector<std::pair<int64_t, int64_t>>& ranges,
                             const std::function<void(size_t, const char*, int64_t)>& consume) {
  finish_writes();  // the bounce buffers are the reads' now
  // Piece p of range r is bytes [offset + p * kPieceBytes, ...) of the range, so pieces never split an
  // element. The pieces of all the ranges form one sequence, read kPiecesInFlight ahead of the one
  // handed out.
  struct Piece {
    size_t range;
    int64_t from, to;
  };
  std::vector<Piece> pieces;
  for (size_t r = 0; r < ranges.size(); ++r)
    for (int64_t from = ranges[r].first, end = from + ranges[r].second; from < end; from += kPieceBytes)
      pieces.push_back({r, from, std::min(end, from + kPieceBytes)});
  // O_DIRECT reads whole pages: the window around a piece, past its ends (another rank's bytes, the
  // neighbouring piece's, nothing past the end of the file), is read but not handed out.
  auto start = [&](size_t k) {
    const int64_t from = pieces[k].from, to = pieces[k].to;
    const int64_t lo = direct() ? align_down(from) : from, hi = direct() ? align_up(to) : to;
    char* buf = piece_buffer(k);
    return std::async(std::launch::async, [this, buf, lo, hi, to] {
      const int fd = direct() ? direct_fd_ : fd_;
      for (int64_t done = 0; done < to - lo;) {  // a short read at the end of the file is fine past `to`
        const ssize_t got = ::pread(fd, buf + done, size_t(hi - lo - done), off_t(lo + done));
        if (got < 0 && errno == EINTR) continue;
        ZP_REQUIRE(got > 0, path_, ": read of bytes [", lo + done, ", ", to, ") failed: ",
                   got < 0 ? std::strerror(errno) : "the file ends there (truncated?)");
        done += got;
      }
    });
  };
  // Piece k reads into buffer k % (kPiecesInFlight + 1); it starts when the piece that used that
  // buffer before has been consumed. Leaving (or throwing), the futures' destructors wait for the
  // reads still in flight, so no buffer is written after it is given up.
  std::future<void> reading[kBuffers];
  for (size_t k = 0; k < std::min(pieces.size(), size_t(kPiecesInFlight)); ++k) reading[k % kBuffers] = start(k);
  for (size_t k = 0; k < pieces.size(); ++k) {
    if (k + kPiecesInFlight < pieces.size()) reading[(k + kPiecesInFlight) % kBuffers] = start(k + kPiecesInFlight);
    reading[k % kBuffers].get();
    const int64_t from = pieces[k].from, to = pieces[k].to;
    consume(pieces[k].range, piece_buffer(k) + (from - (direct() ? align_down(from) : from)), to - from);
  }
}

char* DirectFile::piece_buffer(size_t k) {
  std::unique_ptr<char, Free>& b = buffers_[k % size_t(kBuffers)];
  if (!b) b.reset(allocate_piece_buffer(path_));
  return b.get();
}

void DirectFile::finish_writes() {
  // Both are waited for even when the first failed; the first failure is thrown.
  std::exception_ptr failed;
  for (auto& p : writing_) {
    if (!p.valid()) continue;
    try {
      p.get();
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
}

void DirectFile::sync() {
  finish_writes();
  ZP_REQUIRE(::fsync(fd_) == 0, path_, ": fsync failed: ", std::strerror(errno));
}

}  // namespace zp::io
