// The trick worth knowing here is agreed(): each collective step runs on every rank, then the ranks
// all-reduce whether any of them failed, and the first failing rank's message is broadcast, so either
// every rank goes on to the next collective call or every rank throws the same error and cleans up.
#include "io/checkpoint_file.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <libdeflate.h>
#include <zlib.h>

#include <algorithm>
#include <csignal>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <sstream>

#include "core/error.h"
#include "core/fault_injection.h"
#include "core/log.h"
#include "io/direct_file.h"
#include "kernels/elementwise.h"

namespace zp::io {
namespace fs = std::filesystem;

// --- crc32 -----------------------------------------------------------------------------------

uint32_t crc32(const void* data, size_t bytes, uint32_t crc) { return libdeflate_crc32(crc, data, bytes); }

// --- helpers -----------------------------------------------------------------------------------

namespace {

struct RankInfo {
  int rank = 0, size = 1;
};
// rank/size of comm, or 0/1 when it is null or MPI is not running (serial use).
RankInfo rank_info(MPI_Comm comm) {
  RankInfo r;
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (comm == MPI_COMM_NULL || !init || fin) return r;
  ZP_MPI_CHECK(MPI_Comm_rank(comm, &r.rank));
  ZP_MPI_CHECK(MPI_Comm_size(comm, &r.size));
  return r;
}

// Threads for a rank's copy and CRC (collective over comm): this node's cores shared by its ranks,
// at most 4 each, so that copy and CRC keep up with a fast disk.
int copy_threads(MPI_Comm comm) {
  const RankInfo ri = rank_info(comm);
  int on_node = 1;
  if (ri.size > 1) {
    MPI_Comm node = MPI_COMM_NULL;
    ZP_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, ri.rank, MPI_INFO_NULL, &node));
    ZP_MPI_CHECK(MPI_Comm_size(node, &on_node));
    ZP_MPI_CHECK(MPI_Comm_free(&node));
  }
  return std::clamp(int(std::thread::hardware_concurrency()) / on_node, 1, 4);
}

std::string norm_name(const std::string& n) { return n.empty() || n[0] != '/' ? "/" + n : n; }

// Whether a dataset's bytes lie in one run of the file (the data path reads and writes them itself).
bool contiguous(const DatasetInfo& info) { return info.chunk.empty() && info.file_offset >= 0; }

constexpr size_t kPieceBytes = 64 << 20;  // largest buffer of one verified read

// CRC of `count` elements of `mem_dtype` as they are stored in `file_dtype`.
uint32_t stored_crc(DType file_dtype, DType mem_dtype, const void* data, int64_t count) {
  if (file_dtype == mem_dtype) return crc32(data, size_t(count) * dtype_size(file_dtype));
  constexpr int64_t kPiece = 1 << 20;
  std::vector<char> buf(size_t(std::min(count, kPiece)) * dtype_size(file_dtype));
  uint32_t crc = 0;
  for (int64_t i = 0; i < count; i += kPiece) {
    int64_t c = std::min(kPiece, count - i);
    kernels::cpu::cast(nullptr, file_dtype, buf.data(), mem_dtype,
                       static_cast<const char*>(data) + size_t(i) * dtype_size(mem_dtype), c);
    crc = crc32(buf.data(), size_t(c) * dtype_size(file_dtype), crc);
  }
  return crc;
}

void fsync_path(const std::string& p, bool directory) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  ZP_REQUIRE(fd >= 0, p, ": cannot open for fsync: ", std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  ZP_REQUIRE(rc == 0, p, ": fsync failed: ", std::strerror(err));
}

// Every dataset below `group`, in name order.
void walk_datasets(const H5File& f, const std::string& group, std::vector<std::string>& out) {
  for (const std::string& c : f.children(group)) {
    std::string p = group == "/" ? "/" + c : group + "/" + c;
    if (f.is_group(p)) walk_datasets(f, p, out);
    else if (f.is_dataset(p)) out.push_back(p);
  }
}

// Concatenates every rank's strings (to every rank).
std::vector<std::string> allgather_strings(const std::vector<std::string>& mine, MPI_Comm comm, int size) {
  if (size <= 1) return mine;
  std::string packed;
  for (const auto& s : mine) packed += s + '\n';
  int len = int(packed.size());
  std::vector<int> lens(static_cast<size_t>(size)), displs(static_cast<size_t>(size));
  ZP_MPI_CHECK(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm));
  int total = 0;
  for (int r = 0; r < size; ++r) { displs[size_t(r)] = total; total += lens[size_t(r)]; }
  std::string all(size_t(total), '\0');
  ZP_MPI_CHECK(MPI_Allgatherv(packed.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, comm));
  std::vector<std::string> out;
  std::istringstream in(all);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

// --- CheckpointWriter --------------------------------------------------------------------------

template <class F> void CheckpointWriter::agreed(F&& step) {
  std::string err;
  try {
    step();
  } catch (const std::exception& e) {
    err = explain(*e.what() ? e.what() : "unknown error");
  }
  err = first_error(comm_, err);
  if (!err.empty()) throw Error(err);
}

// A full disk shows deep inside HDF5's error stack ("errno = 28, error message = 'No space left on
// device'"): say so first, with the numbers a user acts on.
std::string CheckpointWriter::explain(const std::string& what) const {
  const fs::path dir = fs::path(path_).parent_path().empty() ? fs::path(".") : fs::path(path_).parent_path();
  struct statvfs v {};
  const bool have_free = ::statvfs(dir.c_str(), &v) == 0;
  const uint64_t free = have_free ? uint64_t(v.f_bavail) * v.f_frsize : 0;
  // MPI-IO words it its own way; a folder with next to nothing free says it too.
  const bool full = what.find("No space left on device") != std::string::npos ||
                    what.find("errno = 28") != std::string::npos || what.find("MPI_ERR_NO_SPACE") != std::string::npos ||
                    (have_free && free < (uint64_t(1) << 20));
  if (!full || what.find(": no space left on device (") != std::string::npos) return what;
  std::string out = path_ + ": no space left on device (" + dir.string();
  if (have_free) out += ": " + std::to_string(free) + " bytes free";
  if (expected_bytes_ > 0) out += "; this file needs about " + std::to_string(expected_bytes_) + " bytes";
  return out + "): " + what;
}

void CheckpointWriter::reserve(int64_t bytes) {
  expected_bytes_ = bytes;
  try {
    agreed([&] {
      if (rank_ != 0 || bytes <= 0) return;
      const int fd = ::open(tmp_path().c_str(), O_WRONLY | O_CLOEXEC);
      ZP_REQUIRE(fd >= 0, tmp_path(), ": cannot open to reserve space: ", std::strerror(errno));
      const int rc = ::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, off_t(bytes));
      const int err = errno;
      ::close(fd);
      if (rc != 0 && err != EOPNOTSUPP && err != ENOSYS)
        throw Error(tmp_path() + ": reserving " + std::to_string(bytes) + " bytes failed: " + std::strerror(err));
    });
  } catch (...) {
    discard();
    throw;
  }
}

CheckpointWriter::CheckpointWriter(const std::string& path, MPI_Comm comm) : path_(path), comm_(comm) {
  RankInfo ri = rank_info(comm);
  rank_ = ri.rank;
  size_ = ri.size;
  copy_threads_ = copy_threads(comm_);
  try {
    agreed([&] {
      fs::path parent = fs::path(path_).parent_path();
      if (rank_ == 0 && !parent.empty()) {
        std::error_code ec;
        fs::create_directories(parent, ec);
        ZP_REQUIRE(!ec, path_, ": cannot create directory ", parent.string(), ": ", ec.message());
      }
    });
    agreed([&] { file_ = H5File::create(tmp_path(), comm_); });
    agreed([&] {
      file_.set_attr_int("/", "zeropipe_format", kCheckpointFormat);
      file_.set_attr_string("/", "checksum", "crc32");
    });
  } catch (...) {
    discard();
    throw;
  }
}

CheckpointWriter::~CheckpointWriter() {
  join_writing();
  if (!committed_) discard();
}

void CheckpointWriter::write_later(const std::string& name, DType file_dtype, const Shape& shape, DType mem_dtype,
                                   const void* data, int64_t offset, int64_t count) {
  const std::string n = norm_name(name);
  write(n, file_dtype, shape, mem_dtype, nullptr, offset, 0);  // creates the dataset
  // Written at once where the data path does not apply: the same choice on every rank, as it
  // depends on the dataset and the dtypes only.
  const DatasetInfo info = file_.dataset_info(n);
  if (mem_dtype != file_dtype || !info.chunk.empty() || info.file_offset < 0) {
    write(n, file_dtype, shape, mem_dtype, data, offset, count);
    return;
  }
  try {
    agreed([&] {
      ZP_REQUIRE(offset >= 0 && count >= 0 && offset <= info.numel() - count, path_, ": dataset '", n,
                 "': write of elements [", offset, ", ", offset + count, ") outside its ", info.numel(), " elements");
    });
  } catch (...) {
    discard();
    throw;
  }
  const int64_t esize = int64_t(dtype_size(file_dtype));
  if (count > 0) later_.push_back({n, data, info.file_offset + offset * esize, offset, count, count * esize});
}

void CheckpointWriter::start_writing() {
  ZP_REQUIRE(!writing_.joinable() && !committed_ && !discarded_, path_, ": start_writing() twice or too late");
  written_ = false;
  writing_ = std::thread([this] {
    // Training goes first: the thread (and the copy threads it starts, which inherit this) takes the
    // cores the steps leave idle. Linux's nice value is per thread; failing to lower it is harmless.
    (void)::setpriority(PRIO_PROCESS, ::gettid(), 10);
    try {
      for (const Later& w : later_) {
        if (fault::hit(fault::Site::Write))
          throw Error(file_.path() + ": dataset '" + w.name + "': write failed: No space left on device" +
                      fault::kInjected);
        // Half the threads of a save that stops training: the steps going on need the cores.
        if (!data_) data_ = std::make_unique<DirectFile>(tmp_path(), true, std::max(1, copy_threads_ / 2));
        slices_[w.name].push_back({w.offset, w.count, data_->write(w.file_offset, w.data, w.bytes)});
      }
      if (data_) data_->sync();
    } catch (const std::exception& e) {
      writing_error_ = explain(e.what());
      // Said at once by the rank that saw it; every rank stops with it at commit().
      ZP_LOG_WARN("writing ", path_, " in the background failed: ", writing_error_);
    }
    written_ = true;
  });
}

bool CheckpointWriter::written() const { return written_; }

void CheckpointWriter::join_writing() {
  if (writing_.joinable()) writing_.join();
}

void CheckpointWriter::discard() {
  if (discarded_) return;
  discarded_ = true;
  // Closing flushes HDF5's metadata. On a full disk that flush fails too, and HDF5 1.10 then frees
  // the file but keeps its id, and crashes on it at exit (HDFGroup/hdf5#2291, fixed in 1.14). Emptying
  // the partial file first gives the few KiB of metadata room (and frees the space at once).
  data_.reset();
  if (rank_ == 0 && file_.is_open()) ::truncate(tmp_path().c_str(), 0);
  try {
    file_.close();
  } catch (const Error& e) {
    ZP_LOG_WARN("abandoning checkpoint ", path_, ": ", e.what(),
                " (HDF5 1.10 may crash at exit after a failed close)");
  }
  file_ = H5File();
  if (rank_ == 0) {
    std::error_code ec;
    fs::remove(tmp_path(), ec);
  }
}

void CheckpointWriter::write(const std::string& name, DType file_dtype, const Shape& shape, DType mem_dtype,
                             const void* data, int64_t offset, int64_t count, const Shape& chunk) {
  std::string n = norm_name(name);
  ZP_REQUIRE(!committed_ && !discarded_, path_, ": write of '", n, "' after the checkpoint was ",
             committed_ ? "committed" : "abandoned after an error");
  ZP_REQUIRE(!writing_.joinable(), path_, ": write of '", n, "' after start_writing()");
  try {
    DatasetInfo info;
    agreed([&] {
      if (!slices_.count(n)) {
        file_.create_dataset(n, file_dtype, shape, chunk);
        order_.push_back(n);
        slices_[n];
      }
      info = file_.dataset_info(n);
      ZP_REQUIRE(info.dtype == file_dtype && info.shape == shape, file_.path(), ": dataset '", n, "': written as ",
                 dtype_name(info.dtype), shape_str(info.shape), ", now as ", dtype_name(file_dtype), shape_str(shape));
    });
    // The same choice on every rank: it depends on the dataset only.
    if (info.chunk.empty() && info.file_offset >= 0 && mem_dtype == file_dtype) {
      uint32_t crc = 0;
      agreed([&] {
        ZP_REQUIRE(offset >= 0 && count >= 0 && offset <= info.numel() - count, file_.path(), ": dataset '", n,
                   "': write of elements [", offset, ", ", offset + count, ") outside its ", info.numel(), " elements");
        if (count == 0) return;
        if (fault::hit(fault::Site::Write))
          throw Error(file_.path() + ": dataset '" + n + "': write failed: No space left on device" + fault::kInjected);
        if (!data_) data_ = std::make_unique<DirectFile>(tmp_path(), true, copy_threads_);
        const size_t esize = dtype_size(file_dtype);
        crc = data_->write(info.file_offset + offset * int64_t(esize), data, count * int64_t(esize));
      });
      if (count > 0) slices_[n].push_back({offset, count, crc});
    } else {
      file_.write_slice(n, mem_dtype, data, offset, count);  // agrees on failure itself
      if (count > 0) slices_[n].push_back({offset, count, stored_crc(file_dtype, mem_dtype, data, count)});
    }
  } catch (const Error& e) {
    discard();
    throw Error(explain(e.what()));
  } catch (...) {
    discard();
    throw;
  }
}

void CheckpointWriter::commit() {
  ZP_REQUIRE(!committed_ && !discarded_, path_, ": commit of a checkpoint that was ",
             committed_ ? "already committed" : "abandoned after an error");
  try {
    join_writing();
    agreed([&] {
      if (!writing_error_.empty()) throw Error(writing_error_);
    });
    // Every rank's (dataset index, offset, count, crc) records, to every rank.
    std::vector<int64_t> mine;
    for (size_t i = 0; i < order_.size(); ++i)
      for (const Slice& s : slices_[order_[i]]) mine.insert(mine.end(), {int64_t(i), s.offset, s.count, int64_t(s.crc)});
    std::vector<int64_t> all = mine;
    if (size_ > 1) {
      int len = int(mine.size());
      std::vector<int> lens(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
      ZP_MPI_CHECK(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_));
      int total = 0;
      for (int r = 0; r < size_; ++r) { displs[size_t(r)] = total; total += lens[size_t(r)]; }
      all.resize(size_t(total));
      ZP_MPI_CHECK(MPI_Allgatherv(mine.data(), len, MPI_INT64_T, all.data(), lens.data(), displs.data(),
                                  MPI_INT64_T, comm_));
    }
    std::vector<std::vector<std::array<int64_t, 3>>> rows(order_.size());
    for (size_t k = 0; k + 3 < all.size(); k += 4) rows[size_t(all[k])].push_back({all[k + 1], all[k + 2], all[k + 3]});
    agreed([&] {
      for (size_t i = 0; i < order_.size(); ++i) {
        std::sort(rows[i].begin(), rows[i].end());
        std::vector<int64_t> flat;
        for (const auto& r : rows[i]) flat.insert(flat.end(), r.begin(), r.end());
        file_.set_attr_ints(order_[i], "slice_checksums", flat, {int64_t(rows[i].size()), 3});
      }
    });
    agreed([&] {
      if (data_) data_->sync();  // each rank its own bytes: what a distributed file system needs
      data_.reset();
      file_.flush();
      file_.close();
    });
    agreed([&] {  // also the barrier: every rank has closed the file before rank 0 renames it
      if (rank_ != 0) return;
      if (expected_bytes_ > 0) {  // give back what reserve() set aside beyond the end of the file
        std::error_code ec;
        const uintmax_t size = fs::file_size(tmp_path(), ec);
        const int fd = ec ? -1 : ::open(tmp_path().c_str(), O_WRONLY | O_CLOEXEC);
        if (fd >= 0 && off_t(size) < off_t(expected_bytes_))
          (void)::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(size), off_t(expected_bytes_) - off_t(size));
        if (fd >= 0) ::close(fd);
      }
      fsync_path(tmp_path(), false);
      rename_into_place(tmp_path(), path_);
      std::string dir = fs::path(path_).parent_path().string();
      try {
        fsync_path(dir.empty() ? "." : dir, true);
      } catch (const Error& e) {  // the file is complete and in place; only the rename's durability is unsure
        ZP_LOG_WARN(e.what());
      }
    });
    committed_ = true;
  } catch (...) {
    discard();
    throw;
  }
}

// --- CheckpointReader --------------------------------------------------------------------------

CheckpointReader::CheckpointReader(const std::string& path, MPI_Comm comm) : copy_threads_(copy_threads(comm)) {
  std::error_code ec;
  ZP_REQUIRE(fs::exists(path, ec), path, ": no such file");
  try {
    file_ = H5File::open(path, false, comm);
  } catch (const Error& e) {
    throw DamagedFileError(e.what());
  }
  if (!file_.has_attr("/", "zeropipe_format") || file_.attr_kind("/", "zeropipe_format") != AttrKind::Int64)
    throw DamagedFileError(path + ": not a ZeRO-Pipe checkpoint (no 'zeropipe_format' attribute on the root group)");
  format_ = file_.attr_int("/", "zeropipe_format");
  if (format_ < 1 || format_ > kCheckpointFormat)
    throw DamagedFileError(path + ": zeropipe_format " + std::to_string(format_) + " is not one this build reads (1.." +
                           std::to_string(kCheckpointFormat) + ")");
  checksummed_ = file_.has_attr("/", "checksum") && file_.attr_kind("/", "checksum") == AttrKind::String &&
                 file_.attr_string("/", "checksum") == "crc32";
}

CheckpointReader::~CheckpointReader() = default;

const std::vector<CheckpointReader::Slice>& CheckpointReader::slices(const std::string& n,
                                                                   const DatasetInfo& info) const {
  auto it = slices_.find(n);
  if (it != slices_.end()) return it->second;
  auto damaged = [&](const std::string& why) { return DamagedFileError(path() + ": dataset '" + n + "': " + why); };
  if (!file_.has_attr(n, "slice_checksums") || file_.attr_kind(n, "slice_checksums") != AttrKind::Int64Array)
    throw damaged("no slice_checksums attribute (the file says every dataset carries one)");
  const std::vector<int64_t> rows = file_.attr_ints(n, "slice_checksums");
  if (rows.size() % 3 != 0) throw damaged("slice_checksums holds " + std::to_string(rows.size()) + " values, not rows of 3");
  std::vector<Slice> out;
  int64_t end = 0;
  for (size_t i = 0; i < rows.size(); i += 3) {
    const int64_t off = rows[i], cnt = rows[i + 1], crc = rows[i + 2];
    if (off < end || cnt <= 0 || cnt > info.numel() - off || crc < 0 || crc > int64_t(UINT32_MAX))
      throw damaged("slice_checksums row " + std::to_string(i / 3) + " (" + std::to_string(off) + ", " +
                    std::to_string(cnt) + ") is out of order or outside the dataset's " +
                    std::to_string(info.numel()) + " elements");
    out.push_back({off, cnt, uint32_t(crc)});
    end = off + cnt;
  }
  return slices_.emplace(n, std::move(out)).first->second;
}

namespace {

// One verified read of elements [lo, hi) of a dataset (slice bounds): takes the stored bytes piece by
// piece, in order, hands each piece to `consume` as stored (file dtype) and checks every slice's CRC
// as its last element passes. The first problem found is kept ("" if none).
class SliceScan {
 public:
  using Consume = std::function<void(const char* raw, int64_t offset, int64_t count)>;
  // `piece`: at most this many elements per consume() call (for stream()); with `threads` > 1,
  // consume may be called from that many threads at once, on disjoint ranges.
  SliceScan(const std::string& path, const std::string& name, const DatasetInfo& info,
            const std::vector<SliceChecksum>& rows, int64_t lo, int64_t hi, int64_t piece, Consume consume, int threads)
      : path_(path), name_(name), rows_(rows), hi_(hi), esize_(int64_t(dtype_size(info.dtype))),
        step_(std::max<int64_t>(1, std::min(piece, DirectFile::kCacheBytes / esize_))), at_(lo),
        consume_(std::move(consume)), threads_(threads) {
    slice_ = std::lower_bound(rows_.begin(), rows_.end(), lo,
                              [](const SliceChecksum& s, int64_t v) { return s.offset + s.count <= v; });
  }
  const std::string& problem() const { return problem_; }
  void fail(const std::string& why) {
    if (problem_.empty()) problem_ = why;
  }

  // The data path's next piece of the range (DirectFile::read).
  void take_bytes(const char* p, int64_t bytes) {
    if (threads_ > 1 && bytes >= threads_ * DirectFile::kCacheBytes) {
      const int64_t c = bytes / esize_;
      take_in_parallel(p, at_, c);
      at_ += c;
      return;
    }
    for (int64_t done = 0; done < bytes;) {  // the caller's piece size, for stream()
      const int64_t c = std::min(step_, (bytes - done) / esize_);
      take(p + done, at_, c);
      at_ += c;
      done += c * esize_;
    }
  }

  // Hands out elements [begin, begin + count) held in `buf`, then checks them.
  void take(const char* buf, int64_t begin, int64_t count) {
    consume_(buf, begin, count);
    check(begin, count, [&](int64_t a, int64_t u, uint32_t c) {
      return crc32(buf + size_t((a - begin) * esize_), size_t((u - a) * esize_), c);
    });
  }

 private:
  // Checks elements [begin, begin + count) against the slices they overlap, in order; crc_of(a, u, c)
  // continues CRC c over elements [a, u). A slice's CRC is complete at its last element.
  void check(int64_t begin, int64_t count, const std::function<uint32_t(int64_t, int64_t, uint32_t)>& crc_of) {
    for (int64_t at = begin; at < begin + count && problem_.empty();) {
      if (slice_ == rows_.end() || slice_->offset > at) {
        const int64_t gap_end = slice_ == rows_.end() ? hi_ : slice_->offset;
        problem_ = path_ + ": dataset '" + name_ + "': elements [" + std::to_string(at) + ", " +
                   std::to_string(gap_end) + ") were never written (no checksummed slice covers them)";
        break;
      }
      const int64_t upto = std::min(begin + count, slice_->offset + slice_->count);
      crc_ = crc_of(at, upto, crc_);
      at = upto;
      if (upto == slice_->offset + slice_->count) {
        if (crc_ != slice_->crc) {
          char line[128];
          std::snprintf(line, sizeof line, "): crc32 %08x in the file, %08x recorded (the file is damaged)", crc_,
                        slice_->crc);
          problem_ = path_ + ": dataset '" + name_ + "': elements [" + std::to_string(slice_->offset) + ", " +
                     std::to_string(slice_->offset + slice_->count) + line;
        }
        crc_ = 0;
        ++slice_;
      }
    }
  }
  // take() on `threads_` threads, whose consume() may run in parallel: the piece is cut at the
  // slices' bounds and into one part per thread; each thread hands out its part and checksums its
  // segments in cache-sized pieces, and the segments' CRCs are combined in order (zlib).
  void take_in_parallel(const char* buf, int64_t begin, int64_t count) {
    std::vector<int64_t> cuts = {begin, begin + count};
    const int64_t part = (count + threads_ - 1) / threads_;
    for (int64_t at = begin + part; at < begin + count; at += part) cuts.push_back(at);
    for (auto r = slice_; r != rows_.end() && r->offset < begin + count; ++r)
      for (int64_t b : {r->offset, r->offset + r->count})
        if (b > begin && b < begin + count) cuts.push_back(b);
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::vector<uint32_t> seg_crc(cuts.size() - 1, 0);
    auto work = [&](int64_t from, int64_t to) {  // the segments inside [from, to)
      for (size_t i = size_t(std::lower_bound(cuts.begin(), cuts.end(), from) - cuts.begin()); cuts[i] < to; ++i)
        for (int64_t a = cuts[i]; a < cuts[i + 1]; a += DirectFile::kCacheBytes / esize_) {
          const int64_t u = std::min(cuts[i + 1], a + DirectFile::kCacheBytes / esize_);
          const char* p = buf + size_t((a - begin) * esize_);
          consume_(p, a, u - a);
          seg_crc[i] = crc32(p, size_t((u - a) * esize_), seg_crc[i]);
        }
    };
    std::vector<std::future<void>> others;
    for (int64_t at = begin + part; at < begin + count; at += part)
      others.push_back(std::async(std::launch::async, work, at, std::min(begin + count, at + part)));
    work(begin, std::min(begin + count, begin + part));
    for (auto& f : others) f.get();
    check(begin, count, [&](int64_t a, int64_t u, uint32_t c) {
      for (size_t i = size_t(std::lower_bound(cuts.begin(), cuts.end(), a) - cuts.begin()); cuts[i] < u; ++i)
        c = uint32_t(::crc32_combine(c, seg_crc[i], z_off_t((cuts[i + 1] - cuts[i]) * esize_)));
      return c;
    });
  }

  const std::string& path_;
  std::string name_;
  const std::vector<SliceChecksum>& rows_;
  int64_t hi_, esize_, step_, at_;
  Consume consume_;
  int threads_;
  std::vector<SliceChecksum>::const_iterator slice_;
  uint32_t crc_ = 0;
  std::string problem_;
};

// What an empty range scans against: a rank with nothing to read, or one that found a problem
// before, must not look at the slices (they may be what is damaged).
const std::vector<SliceChecksum> kNoSlices;

// Reads `ranges` of the file at `path` through the data path as one stream of pieces (opening it on
// first use), range r's bytes going to scans[r]; a failed read is the problem of the range that was
// being read.
void stream_ranges(std::unique_ptr<DirectFile>& data, const std::string& path,
                   const std::vector<std::pair<int64_t, int64_t>>& ranges, const std::vector<SliceScan*>& scans) {
  if (ranges.empty()) return;
  if (!data) data = std::make_unique<DirectFile>(path, false);
  size_t current = 0;
  try {
    data->read_ranges(ranges, [&](size_t r, const char* p, int64_t bytes) {
      current = r;
      scans[r]->take_bytes(p, bytes);
    });
  } catch (const Error& e) {
    scans[current]->fail(e.what());
  }
}

}  // namespace

std::string CheckpointReader::scan(const std::string& n, const DatasetInfo& info, int64_t lo, int64_t hi,
                                   int64_t piece,
                                   const std::function<void(const char*, int64_t, int64_t)>& consume,
                                   int threads) const {
  // An empty range still joins the collective reads.
  SliceScan sc(path(), n, info, lo < hi ? slices(n, info) : kNoSlices, lo, hi, piece, consume, threads);
  const int64_t esize = int64_t(dtype_size(info.dtype));
  // A contiguous dataset's bytes are read by each rank itself (the same choice on every rank: it
  // depends on the dataset only), in pieces of at most `piece` elements.
  if (contiguous(info)) {
    if (lo < hi) stream_ranges(data_, path(), {{info.file_offset + lo * esize, (hi - lo) * esize}}, {&sc});
    return sc.problem();
  }
  // Collective reads: every rank makes as many as the rank with the most pieces.
  int64_t pieces = (hi - lo + piece - 1) / piece;
  if (file_.parallel()) ZP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &pieces, 1, MPI_INT64_T, MPI_MAX, file_.comm()));
  std::vector<char> buf;
  for (int64_t p = 0; p < pieces; ++p) {
    const int64_t begin = lo + p * piece, count = std::clamp<int64_t>(hi - begin, 0, piece);
    buf.resize(size_t(std::max<int64_t>(count, 1) * esize));
    file_.read_slice(n, info.dtype, buf.data(), begin, count);
    if (count > 0) sc.take(buf.data(), begin, count);
  }
  return sc.problem();
}

CheckpointReader::PlannedRead CheckpointReader::plan_read(const ReadRequest& r) const {
  PlannedRead pr;
  pr.name = norm_name(r.name);
  const std::string& n = pr.name;
  pr.info = shaped_info(n, r.expected_shape);
  const DatasetInfo& info = pr.info;
  ZP_REQUIRE(r.mem_dtype == info.dtype || (dtype_is_float(r.mem_dtype) && dtype_is_float(info.dtype)), path(),
             ": dataset '", n, "': cannot read ", dtype_name(info.dtype), " data as ", dtype_name(r.mem_dtype));
  ZP_REQUIRE(r.offset >= 0 && r.count >= 0 && r.offset <= info.numel() - r.count, path(), ": dataset '", n,
             "': read of elements [", r.offset, ", ", r.offset + r.count, ") outside its ", info.numel(), " elements");
  // Widen [offset, offset + count) to the bounds of the slices it touches.
  int64_t lo = r.offset, hi = r.offset + r.count;
  try {
    if (r.count > 0) {
      const std::vector<Slice>& rows = slices(n, info);
      auto first = std::lower_bound(rows.begin(), rows.end(), lo,
                                    [](const Slice& s, int64_t v) { return s.offset + s.count <= v; });
      auto last = std::lower_bound(rows.begin(), rows.end(), hi,
                                   [](const Slice& s, int64_t v) { return s.offset + s.count < v; });
      if (first != rows.end()) lo = std::min(lo, first->offset);
      if (last != rows.end() && last->offset < hi) hi = std::max(hi, last->offset + last->count);
    }
  } catch (const DamagedFileError& e) {
    pr.problem = e.what();
  }
  // A problem found here reads nothing (but still joins the collective reads).
  pr.lo = pr.problem.empty() ? lo : 0;
  pr.hi = pr.problem.empty() ? hi : 0;
  const size_t esize = dtype_size(info.dtype), msize = dtype_size(r.mem_dtype);
  if (r.count > 0) bytes_read_ += (pr.hi - pr.lo) * int64_t(esize);
  pr.consume = [r, esize, msize, file_dtype = info.dtype](const char* raw, int64_t at, int64_t c) {
    const int64_t from = std::max(at, r.offset), to = std::min(at + c, r.offset + r.count);
    if (from >= to) return;
    char* dst = static_cast<char*>(r.data) + size_t(from - r.offset) * msize;
    const char* src = raw + size_t(from - at) * esize;
    if (r.mem_dtype == file_dtype) std::memcpy(dst, src, size_t(to - from) * esize);
    else kernels::cpu::cast(nullptr, r.mem_dtype, dst, file_dtype, src, to - from);
  };
  return pr;
}

void CheckpointReader::read(const std::string& name, const Shape& expected_shape, DType mem_dtype, void* data,
                            int64_t offset, int64_t count) const {
  read_all({{name, expected_shape, mem_dtype, data, offset, count}});
}

DatasetInfo CheckpointReader::shaped_info(const std::string& n, const Shape& expected_shape) const {
  DatasetInfo info = file_.dataset_info(n);
  ZP_REQUIRE(info.shape == expected_shape, path(), ": dataset '", n, "': shape ", shape_str(info.shape),
             " in the file, expected ", shape_str(expected_shape));
  return info;
}

void CheckpointReader::read_unverified(const ReadRequest& r) const {
  const std::string n = norm_name(r.name);
  const DatasetInfo info = shaped_info(n, r.expected_shape);
  file_.read_slice(n, r.mem_dtype, r.data, r.offset, r.count);
  bytes_read_ += r.count * int64_t(dtype_size(info.dtype));
}

void CheckpointReader::read_all(const std::vector<ReadRequest>& requests) const {
  if (!checksummed_) {
    for (const ReadRequest& r : requests) read_unverified(r);
    return;
  }
  std::vector<PlannedRead> planned;
  for (const ReadRequest& r : requests) planned.push_back(plan_read(r));
  // One stream of pieces over every contiguous dataset; the others (and every dataset, where one is
  // not contiguous: the same choice on every rank) read as read() does, in order.
  const bool streamed = std::all_of(planned.begin(), planned.end(), [](const PlannedRead& pr) { return contiguous(pr.info); });
  std::string problem;
  if (!streamed) {
    for (const PlannedRead& pr : planned) {
      if (!pr.problem.empty() && !file_.parallel()) {
        if (problem.empty()) problem = pr.problem;
        continue;
      }
      const std::string scanned = scan(pr.name, pr.info, pr.lo, pr.hi, int64_t(kPieceBytes / dtype_size(pr.info.dtype)),
                                       pr.consume, copy_threads_);
      if (problem.empty()) problem = !pr.problem.empty() ? pr.problem : scanned;
    }
  } else {
    std::vector<std::unique_ptr<SliceScan>> scans;
    std::vector<std::pair<int64_t, int64_t>> ranges;
    std::vector<SliceScan*> scan_of_range;
    for (const PlannedRead& pr : planned) {
      const int64_t esize = int64_t(dtype_size(pr.info.dtype));
      scans.push_back(std::make_unique<SliceScan>(path(), pr.name, pr.info,
                                                  pr.lo < pr.hi ? slices(pr.name, pr.info) : kNoSlices, pr.lo, pr.hi,
                                                  kPieceBytes / esize, pr.consume, copy_threads_));
      if (!pr.problem.empty()) scans.back()->fail(pr.problem);
      if (pr.lo >= pr.hi) continue;
      ranges.push_back({pr.info.file_offset + pr.lo * esize, (pr.hi - pr.lo) * esize});
      scan_of_range.push_back(scans.back().get());
    }
    stream_ranges(data_, path(), ranges, scan_of_range);
    for (const auto& sc : scans)
      if (problem.empty()) problem = sc->problem();
  }
  if (file_.parallel()) problem = first_error(file_.comm(), problem);
  if (!problem.empty()) throw DamagedFileError(problem);
}

void CheckpointReader::stream(const std::string& name, DType mem_dtype, int64_t piece,
                              const std::function<void(const void*, int64_t, int64_t)>& consume) const {
  ZP_CHECK(!file_.parallel(), "CheckpointReader::stream is serial");
  const std::string n = norm_name(name);
  const DatasetInfo info = file_.dataset_info(n);
  ZP_REQUIRE(mem_dtype == info.dtype || (dtype_is_float(mem_dtype) && dtype_is_float(info.dtype)), path(),
             ": dataset '", n, "': cannot read ", dtype_name(info.dtype), " data as ", dtype_name(mem_dtype));
  piece = std::max<int64_t>(1, piece);
  std::vector<char> converted;
  auto hand_out = [&](const char* raw, int64_t at, int64_t c) {
    if (mem_dtype == info.dtype) return consume(raw, at, c);
    converted.resize(size_t(c) * dtype_size(mem_dtype));
    kernels::cpu::cast(nullptr, mem_dtype, converted.data(), info.dtype, raw, c);
    consume(converted.data(), at, c);
  };
  if (!checksummed_) {
    std::vector<char> buf;
    for (int64_t at = 0; at < info.numel(); at += piece) {
      const int64_t c = std::min(piece, info.numel() - at);
      buf.resize(size_t(c) * dtype_size(info.dtype));
      file_.read_slice(n, info.dtype, buf.data(), at, c);
      bytes_read_ += c * int64_t(dtype_size(info.dtype));
      hand_out(buf.data(), at, c);
    }
    return;
  }
  const std::string problem = scan(n, info, 0, info.numel(), piece, hand_out);
  bytes_read_ += info.numel() * int64_t(dtype_size(info.dtype));
  if (!problem.empty()) throw DamagedFileError(problem);
}

// --- verification and inspection ---------------------------------------------------------------

ChecksumReport verify_checksums(const std::string& path, MPI_Comm comm) {
  H5File f = H5File::open(path, false, comm);
  RankInfo ri = f.parallel() ? rank_info(comm) : RankInfo{};
  ChecksumReport rep;
  std::vector<std::string> shared, mine;  // shared: found identically by every rank
  std::vector<std::string> datasets;
  walk_datasets(f, "/", datasets);
  std::vector<char> buf;
  for (const std::string& ds : datasets) {
    if (!f.has_attr(ds, "slice_checksums")) { ++rep.unchecked; continue; }
    DatasetInfo info = f.dataset_info(ds);
    std::vector<int64_t> rows = f.attr_ints(ds, "slice_checksums");
    if (rows.size() % 3 != 0) {
      shared.push_back(ds + ": slice_checksums holds " + std::to_string(rows.size()) + " values, not rows of 3");
      continue;
    }
    ++rep.datasets;
    int64_t nslices = int64_t(rows.size() / 3);
    rep.slices += nslices;
    // Rows are sorted by offset: gaps and overlaps show between neighbours.
    int64_t covered = 0;
    for (int64_t s = 0; s < nslices; ++s) {
      int64_t off = rows[size_t(3 * s)], cnt = rows[size_t(3 * s + 1)];
      if (off > covered)
        shared.push_back(ds + ": elements [" + std::to_string(covered) + ", " + std::to_string(off) + ") were never written");
      else if (off < covered)
        shared.push_back(ds + ": written slices overlap at element " + std::to_string(off));
      covered = std::max(covered, off + cnt);
    }
    if (covered < info.numel())
      shared.push_back(ds + ": elements [" + std::to_string(covered) + ", " + std::to_string(info.numel()) +
                       ") were never written");
    // Round r: rank k re-reads slice r*size + k, in pieces; all ranks join every collective read.
    const size_t esize = dtype_size(info.dtype);
    const int64_t piece = int64_t(kPieceBytes / esize);
    for (int64_t round = 0; round * ri.size < nslices; ++round) {
      int64_t s = round * ri.size + ri.rank;
      bool have = s < nslices;
      int64_t off = have ? rows[size_t(3 * s)] : 0, cnt = have ? rows[size_t(3 * s + 1)] : 0;
      bool in_range = off >= 0 && cnt >= 0 && off + cnt <= info.numel();
      if (have && !in_range) {
        mine.push_back(ds + ": recorded slice [" + std::to_string(off) + ", " + std::to_string(off + cnt) +
                       ") lies outside the dataset");
        cnt = 0;
      }
      int64_t pieces = (cnt + piece - 1) / piece;
      if (f.parallel()) ZP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &pieces, 1, MPI_INT64_T, MPI_MAX, comm));
      uint32_t crc = 0;
      for (int64_t p = 0; p < pieces; ++p) {
        int64_t c = std::clamp<int64_t>(cnt - p * piece, 0, piece);
        buf.resize(size_t(std::max<int64_t>(c, 1)) * esize);
        f.read_slice(ds, info.dtype, buf.data(), off + p * piece, c);
        crc = crc32(buf.data(), size_t(c) * esize, crc);
      }
      uint32_t want = have ? uint32_t(rows[size_t(3 * s + 2)]) : 0;
      if (have && cnt > 0 && crc != want) {
        char line[160];
        std::snprintf(line, sizeof line, ": elements [%lld, %lld): crc32 %08x in the file, %08x recorded",
                      (long long)off, (long long)(off + cnt), crc, want);
        mine.push_back(ds + line);
      }
    }
  }
  rep.problems = allgather_strings(mine, comm, ri.size);
  rep.problems.insert(rep.problems.end(), shared.begin(), shared.end());
  std::sort(rep.problems.begin(), rep.problems.end());
  return rep;
}

std::string probe_metadata(const std::string& path) {
  int fds[2];
  ZP_REQUIRE(::pipe(fds) == 0, "pipe: ", std::strerror(errno));
  std::fflush(nullptr);  // nothing buffered may be written twice
  const pid_t pid = ::fork();
  ZP_REQUIRE(pid >= 0, "fork: ", std::strerror(errno));
  if (pid == 0) {
    ::close(fds[0]);
    for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE}) std::signal(sig, SIG_DFL);  // no MPI backtrace: the parent reports
    std::string err;
    try {
      const H5File f = H5File::open(path);
      std::vector<std::string> objects = {"/"};
      walk_datasets(f, "/", objects);
      for (const std::string& o : objects) {
        if (o != "/") f.dataset_info(o);
        for (const std::string& a : f.attr_names(o)) switch (f.attr_kind(o, a)) {
            case AttrKind::String: f.attr_string(o, a); break;
            case AttrKind::Int64: f.attr_int(o, a); break;
            case AttrKind::Double: f.attr_double(o, a); break;
            case AttrKind::Int64Array: f.attr_ints(o, a); break;
            default: break;
          }
      }
    } catch (const std::exception& e) {
      err = e.what();
    }
    ssize_t ignored = ::write(fds[1], err.data(), err.size());
    (void)ignored;
    ::_exit(err.empty() ? 0 : 1);  // no atexit handlers: they belong to the parent's HDF5 and MPI
  }
  ::close(fds[1]);
  std::string err;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) err.append(buf, size_t(n));
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  if (WIFSIGNALED(status))
    return path + ": reading its HDF5 metadata crashed the HDF5 library (signal " + std::to_string(WTERMSIG(status)) +
           "): the file is damaged";
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  return err.empty() ? path + ": its HDF5 metadata could not be read" : err;
}

namespace {

void print_attrs(std::ostream& o, const H5File& f, const std::string& obj, const std::string& indent) {
  for (const std::string& a : f.attr_names(obj)) {
    if (a == "slice_checksums") continue;  // summarised on the dataset line
    o << indent << "@" << a << " = ";
    switch (f.attr_kind(obj, a)) {
      case AttrKind::String: {
        std::string s = f.attr_string(obj, a);
        if (s.find('\n') == std::string::npos) {
          o << s;
        } else {  // multi-line (pretty JSON): indent the continuation lines
          std::istringstream in(s);
          bool first = true;
          for (std::string line; std::getline(in, line); first = false) o << (first ? "" : "\n" + indent + "    ") << line;
        }
        break;
      }
      case AttrKind::Int64: o << f.attr_int(obj, a); break;
      case AttrKind::Double: {
        char b[40];
        std::snprintf(b, sizeof b, "%.17g", f.attr_double(obj, a));
        o << b;
        break;
      }
      case AttrKind::Bytes: o << "<" << f.attr_bytes(obj, a).size() << " bytes>"; break;
      case AttrKind::Int64Array: {
        std::vector<int64_t> v = f.attr_ints(obj, a);
        if (v.size() > 16) {
          o << "int64" << shape_str(f.attr_shape(obj, a));
        } else {
          o << "[";
          for (size_t i = 0; i < v.size(); ++i) o << (i ? ", " : "") << v[i];
          o << "]";
        }
        break;
      }
      case AttrKind::Other: o << "(attribute of a type this tool does not show)"; break;
    }
    o << "\n";
  }
}

void print_tree(std::ostream& o, const H5File& f, const std::string& group, int depth) {
  std::string indent(size_t(2 * depth), ' ');
  for (const std::string& c : f.children(group)) {
    std::string p = group == "/" ? "/" + c : group + "/" + c;
    if (f.is_group(p)) {
      o << indent << p << "/\n";
      print_attrs(o, f, p, indent + "  ");
      print_tree(o, f, p, depth + 1);
    } else if (f.is_dataset(p)) {
      o << indent << p << "  ";
      try {
        DatasetInfo info = f.dataset_info(p);
        o << dtype_name(info.dtype) << shape_str(info.shape);
        if (!info.chunk.empty()) o << "  chunks " << shape_str(info.chunk);
        if (f.has_attr(p, "slice_checksums")) o << "  " << f.attr_ints(p, "slice_checksums").size() / 3 << " checksummed slices";
      } catch (const Error& e) {
        o << "(" << e.what() << ")";
      }
      o << "\n";
      print_attrs(o, f, p, indent + "  ");
    } else {
      o << indent << p << "  (link to nothing or to another kind of object)\n";
    }
  }
}

}  // namespace

std::string inspect(const std::string& path, bool verify) {
  std::ostringstream o;
  {
    H5File f = H5File::open(path);
    std::error_code ec;
    o << path << "  (" << fs::file_size(path, ec) << " bytes)\n";
    if (f.has_attr("/", "zeropipe_format"))
      o << "ZeRO-Pipe format " << f.attr_int("/", "zeropipe_format") << "\n";
    else
      o << "not a ZeRO-Pipe file (no zeropipe_format attribute)\n";
    o << "/\n";
    print_attrs(o, f, "/", "  ");
    print_tree(o, f, "/", 1);
  }
  if (verify) {
    ChecksumReport rep = verify_checksums(path);
    o << "checksums: " << (rep.ok() ? "ok" : "FAILED") << " (" << rep.datasets << " datasets, " << rep.slices
      << " slices";
    if (rep.unchecked) o << ", " << rep.unchecked << " datasets without checksums";
    o << ")\n";
    for (const auto& p : rep.problems) o << "  " << p << "\n";
  }
  return o.str();
}

// --- rotation ----------------------------------------------------------------------------------

std::string checkpoint_filename(int64_t step, const std::string& prefix) {
  char digits[32];
  std::snprintf(digits, sizeof digits, "%08lld", (long long)step);
  return prefix + digits + ".h5";
}

std::vector<CheckpointEntry> list_checkpoints(const std::string& dir, const std::string& prefix) {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (!e.is_regular_file(ec) || name.size() <= prefix.size() + 3 || !name.starts_with(prefix) ||
        !name.ends_with(".h5"))
      continue;
    std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - 3);
    if (digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    out.push_back({std::stoll(digits), e.path().string()});
  }
  std::sort(out.begin(), out.end(), [](const CheckpointEntry& a, const CheckpointEntry& b) {
    return a.step != b.step ? a.step < b.step : a.path < b.path;
  });
  return out;
}

std::optional<std::string> latest_checkpoint(const std::string& dir, const std::string& prefix) {
  auto all = list_checkpoints(dir, prefix);
  if (all.empty()) return std::nullopt;
  return all.back().path;
}

std::vector<std::string> keep_last_checkpoints(const std::string& dir, const std::string& prefix, int keep,
                                               MPI_Comm comm) {
  ZP_REQUIRE(keep >= 1, "keep_last_checkpoints: keep must be at least 1, got ", keep);
  RankInfo ri = rank_info(comm);
  std::vector<std::string> deleted;
  if (ri.rank == 0) {
    auto all = list_checkpoints(dir, prefix);
    for (size_t i = 0; i + size_t(keep) < all.size(); ++i) {
      std::error_code ec;
      if (fs::remove(all[i].path, ec)) deleted.push_back(all[i].path);
      else if (ec) ZP_LOG_WARN(all[i].path, ": cannot delete old checkpoint: ", ec.message());
    }
  }
  if (ri.size > 1) ZP_MPI_CHECK(MPI_Barrier(comm));
  return deleted;
}

}  // namespace zp::io
