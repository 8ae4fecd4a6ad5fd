#include "io/nvme_swap_file.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/fault_injection.h"
#include "core/log.h"

namespace zp::io {

namespace {

// One piece of a request, as it goes to the kernel (and back, advanced, after a short transfer).
struct Piece {
  NvmeSwapFile::Ticket ticket = 0;
  bool write = false;
  int64_t offset = 0, bytes = 0;
  char* buf = nullptr;
};

struct TicketState {
  int64_t pieces_left = 0;
  std::string error;  // the first failure of any piece
};

int64_t free_bytes(const std::string& dir) {
  struct statvfs v {};
  return ::statvfs(dir.c_str(), &v) == 0 ? int64_t(v.f_bavail) * int64_t(v.f_frsize) : -1;
}

}  // namespace

struct NvmeSwapFile::Impl {
  std::string dir, key, path;
  int fd = -1;
  bool direct = true;
  int64_t size = 0, block = 0;
  int depth = 0;
  io_uring ring{};
  bool ring_ready = false;

  std::mutex mu;
  std::condition_variable done, work;
  std::deque<Piece> waiting;  // not yet given to the kernel, in request order
  int in_kernel = 0;
  std::map<Ticket, TicketState> tickets;  // not yet waited for
  Ticket next = 1;
  bool stop = false;
  std::thread reaper;

  std::string where() const { return key + " '" + dir + "'"; }

  std::string failure(const Piece& p, int err, const char* extra = "") const {
    return detail::cat(where(), ": ", p.write ? "writing " : "reading ", p.bytes, " bytes at offset ", p.offset,
                       " of the swap file ", path, " failed: ", std::strerror(err), extra);
  }

  // Ends piece `p` of its ticket, with `error` when it failed. Caller holds mu.
  void finish(const Piece& p, const std::string& error) {
    TicketState& t = tickets.at(p.ticket);
    if (!error.empty() && t.error.empty()) t.error = error;
    if (--t.pieces_left == 0) done.notify_all();
  }

  // Gives waiting pieces to the kernel up to the queue depth. Caller holds mu.
  void submit() {
    int added = 0;
    while (in_kernel < depth && !waiting.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      if (!sqe) break;  // the submission queue is full until io_uring_submit below
      auto* p = new Piece(waiting.front());
      waiting.pop_front();
      if (p->write)
        io_uring_prep_write(sqe, fd, p->buf, unsigned(p->bytes), uint64_t(p->offset));
      else
        io_uring_prep_read(sqe, fd, p->buf, unsigned(p->bytes), uint64_t(p->offset));
      io_uring_sqe_set_data(sqe, p);
      ++in_kernel;
      ++added;
    }
    if (added == 0) return;
    const int rc = io_uring_submit(&ring);
    if (rc < 0) ZP_FATAL(where(), ": io_uring_submit: ", std::strerror(-rc));
    work.notify_one();
  }

  // The I/O thread: completions in, waiting pieces out, until stopped with nothing in the kernel.
  void reap() {
    std::unique_lock lk(mu);
    for (;;) {
      work.wait(lk, [&] { return stop || in_kernel > 0; });
      if (in_kernel == 0) return;  // stop, and nothing left to reap
      lk.unlock();
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(&ring, &cqe);
      lk.lock();
      if (rc == -EINTR || rc == -EAGAIN) continue;
      if (rc < 0) ZP_FATAL(where(), ": io_uring_wait_cqe: ", std::strerror(-rc));
      std::unique_ptr<Piece> p(static_cast<Piece*>(io_uring_cqe_get_data(cqe)));
      const int res = cqe->res;
      io_uring_cqe_seen(&ring, cqe);
      --in_kernel;
      if (res < 0) {
        finish(*p, failure(*p, -res));
      } else if (res == 0) {
        // Nothing moved and no error: past the end of the file, or a write the disk no longer takes.
        finish(*p, failure(*p, p->write ? ENOSPC : EIO, p->write ? "" : " (end of file)"));
      } else if (res < p->bytes) {
        // A short transfer: the rest goes again, first, so the ticket's pieces stay in order.
        Piece rest = *p;
        rest.offset += res;
        rest.buf += res;
        rest.bytes -= res;
        waiting.push_front(rest);
      } else {
        finish(*p, "");
      }
      submit();
    }
  }

  Ticket start(bool write, int64_t offset, char* buf, int64_t bytes) {
    ZP_CHECK(offset >= 0 && bytes >= 0 && offset + bytes <= size, "swap file request [", offset, ", ",
             offset + bytes, ") of ", size, " bytes");
    ZP_CHECK(offset % kAlign == 0 && bytes % kAlign == 0 && reinterpret_cast<uintptr_t>(buf) % kAlign == 0,
             "swap file requests are aligned to ", kAlign, " bytes: offset ", offset, ", bytes ", bytes);
    std::lock_guard lk(mu);
    const Ticket t = next++;
    TicketState& st = tickets[t];
    if (write && fault::hit(fault::Site::Write)) {
      st.error = failure(Piece{t, true, offset, bytes, buf}, ENOSPC, fault::kInjected);
      return t;
    }
    for (int64_t b = 0; b < bytes; b += block) {
      waiting.push_back(Piece{t, write, offset + b, std::min(block, bytes - b), buf + b});
      ++st.pieces_left;
    }
    submit();
    return t;
  }

  // Preallocates [from, from + bytes) of the file, so that a disk too small fails here, not mid-step.
  void allocate(int64_t from, int64_t bytes) {
    if (bytes <= 0 || ::fallocate(fd, 0, from, bytes) == 0) return;
    const int err = errno;
    if (err == ENOSPC)
      throw Error(detail::cat(where(), ": the swap file needs ", from + bytes, " bytes",
                              from > 0 ? detail::cat(" (", bytes, " more)") : std::string(), ", but only ",
                              free_bytes(dir), " bytes are free there (No space left on device)"));
    // Some file systems cannot preallocate; the size is then set and a full disk shows at a write.
    if (err != EOPNOTSUPP && err != ENOSYS)
      throw Error(detail::cat(where(), ": preallocating ", bytes, " bytes for the swap file failed: ",
                              std::strerror(err)));
    if (::ftruncate(fd, from + bytes) != 0)
      throw Error(detail::cat(where(), ": sizing the swap file to ", from + bytes, " bytes failed: ",
                              std::strerror(errno)));
  }

  // Blocks until ticket t is complete and forgets it; its failure, or "". Caller holds lk.
  std::string settle(std::unique_lock<std::mutex>& lk, Ticket t) {
    auto it = tickets.find(t);
    ZP_CHECK(it != tickets.end(), "swap file ticket ", t, " was never issued or already waited for");
    done.wait(lk, [&] { return it->second.pieces_left == 0; });
    std::string error = std::move(it->second.error);
    tickets.erase(it);
    return error;
  }
};

NvmeSwapFile::NvmeSwapFile(const std::string& dir, const std::string& key, const std::string& name, int64_t bytes,
                           int64_t block_size, int queue_depth)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.dir = dir;
  m.key = key;
  m.size = (bytes + kAlign - 1) / kAlign * kAlign;
  // Pieces stay aligned for O_DIRECT: aio.block_size is at least 4096 and rounded down to kAlign.
  m.block = std::max(kAlign, block_size / kAlign * kAlign);
  m.depth = std::max(1, queue_depth);
  ZP_REQUIRE(!dir.empty(), key, " is empty: the directory for the swap files");
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int err = errno;
    ZP_REQUIRE(err != ENOENT, m.where(), ": does not exist");
    ZP_REQUIRE(err != ENOTDIR, m.where(), ": is not a directory (a component of the path is a file)");
    throw Error(detail::cat(m.where(), ": cannot be read: ", std::strerror(err)));
  }
  ZP_REQUIRE(S_ISDIR(st.st_mode), m.where(), ": is not a directory");
  m.path = (dir.back() == '/' ? dir : dir + "/") + name;
  m.fd = ::open(m.path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (m.fd < 0) {
    const int err = errno;
    const bool refused = err == EACCES || err == EPERM || err == EROFS;
    throw Error(detail::cat(m.where(), refused ? ": not writable" : "", ": cannot create the swap file ", m.path,
                            ": ", std::strerror(err)));
  }
  // Unlinked at once: the file lives while the descriptor is open and disappears however the process
  // ends (exit, an exception, SIGKILL, a node's OOM killer), where DeepSpeed leaves its swap files
  // behind to fill the disk of the next job.
  ::unlink(m.path.c_str());
  // O_DIRECT is asked for after the file exists: a file system that refuses it (ramfs, some FUSE and
  // network file systems) may refuse it only after creating the file, which an open with O_DIRECT
  // would then leave behind.
  const int flags = ::fcntl(m.fd, F_GETFL);
  if (flags < 0 || ::fcntl(m.fd, F_SETFL, flags | O_DIRECT) != 0) {
    m.direct = false;
    ZP_LOG_WARN(m.where(), ": the file system refuses O_DIRECT (", std::strerror(errno), "); the swap file uses "
                "buffered I/O, through the page cache (slower, and it competes with the process for host memory)");
  }
  try {
    m.allocate(0, m.size);
  } catch (const Error&) {
    ::close(m.fd);
    m.fd = -1;
    throw;
  }
  auto fail = [&](const std::string& what) {
    ::close(m.fd);
    m.fd = -1;
    throw Error(what);
  };
  const int rc = io_uring_queue_init(unsigned(m.depth), &m.ring, 0);
  if (rc < 0)
    fail(detail::cat(m.where(), ": io_uring with aio.queue_depth = ", m.depth, " cannot be set up: ",
                     std::strerror(-rc)));
  m.ring_ready = true;
  m.reaper = std::thread([&m] { m.reap(); });
}

NvmeSwapFile::~NvmeSwapFile() {
  Impl& m = *impl_;
  if (m.reaper.joinable()) {
    {
      std::unique_lock lk(m.mu);
      // Buffers of requests never waited for may be freed right after: let the kernel finish with them.
      m.done.wait(lk, [&] {
        for (const auto& [t, st] : m.tickets)
          if (st.pieces_left > 0) return false;
        return true;
      });
      m.stop = true;
    }
    m.work.notify_all();
    m.reaper.join();
  }
  if (m.ring_ready) io_uring_queue_exit(&m.ring);
  if (m.fd >= 0) ::close(m.fd);
}

NvmeSwapFile::Ticket NvmeSwapFile::write(int64_t offset, const void* src, int64_t bytes) {
  return impl_->start(true, offset, static_cast<char*>(const_cast<void*>(src)), bytes);
}

NvmeSwapFile::Ticket NvmeSwapFile::read(int64_t offset, void* dst, int64_t bytes) {
  return impl_->start(false, offset, static_cast<char*>(dst), bytes);
}

void NvmeSwapFile::wait(Ticket t) {
  std::unique_lock lk(impl_->mu);
  const std::string error = impl_->settle(lk, t);
  if (!error.empty()) throw Error(error);
}

void NvmeSwapFile::wait_all() {
  std::unique_lock lk(impl_->mu);
  std::string first;
  while (!impl_->tickets.empty()) {
    std::string error = impl_->settle(lk, impl_->tickets.begin()->first);
    if (first.empty()) first = std::move(error);
  }
  if (!first.empty()) throw Error(first);
}

const std::string& NvmeSwapFile::path() const { return impl_->path; }
int64_t NvmeSwapFile::size() const {
  std::lock_guard lk(impl_->mu);
  return impl_->size;
}

int64_t NvmeSwapFile::extend(int64_t bytes) {
  Impl& m = *impl_;
  const int64_t more = (bytes + kAlign - 1) / kAlign * kAlign;
  const int64_t from = size();
  m.allocate(from, more);  // requests in flight end before `from`: the new part is nobody's yet
  std::lock_guard lk(m.mu);
  m.size = from + more;
  return from;
}
bool NvmeSwapFile::direct() const { return impl_->direct; }

}  // namespace zp::io
