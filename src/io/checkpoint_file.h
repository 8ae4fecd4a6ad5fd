// The checkpoint / weights file format (DESIGN decisions 6 and 7), on top of H5File.
//
// Layout: one HDF5 file written collectively by all ranks. Every tensor is a dataset with its full
// logical shape (parameters under /model/<name>, Adam moments under /optimizer/<name>/exp_avg and
// exp_avg_sq, by the caller's choice of names); the root carries "zeropipe_format" = 1 and
// "checksum" = "crc32", and the caller adds step, config JSON, RNG states and data position as
// attributes. Each rank writes and reads only the contiguous flat ranges it owns, so any world size
// can resume any checkpoint.
//
// Checksums. A rank only ever sees its own slice, and a whole-dataset checksum would need either a
// second full read or a combinable hash. So each dataset carries an int64 attribute
// "slice_checksums" of shape [n, 3]: rows (flat offset, element count, crc32) for every range a
// writer wrote, sorted by offset. The CRC is zlib's crc32 of the slice's bytes as stored in the file
// (little-endian, in the file dtype), so h5py + zlib can check a file too. verify_checksums() re-reads
// each recorded range and also reports elements no writer covered (a rank that never wrote).
//
// Full disks. reserve() allocates the file's expected size up front (fallocate), so running out of
// room is found before HDF5 writes anything; a write that still fails with ENOSPC is reported as
// "no space left on device" with the folder's free bytes and the bytes the file needs.
//
// Data path. HDF5 writes and reads the metadata (groups, datasets, attributes); the bytes of a
// contiguous dataset (all of ZeRO-Pipe's) are moved by each rank itself at the dataset's address in
// the file (io/direct_file.h: O_DIRECT, large requests, CRC overlapped with the disk), so the file is
// an ordinary HDF5 file to any reader. New files align datasets of 64 KiB and more to 4 KiB pages.
// Chunked datasets and writes that convert the dtype go through HDF5 (H5File::write_slice), and so
// do reads of datasets another tool wrote chunked.
//
// Atomic save. CheckpointWriter writes <path>.tmp; commit() records the checksums, flushes and
// closes the file, then rank 0 fsyncs it, renames it to <path> and fsyncs the directory, between
// barriers. Any failure on any rank (out of space, a bad shape) is agreed on by all ranks, so they
// all throw the same zp::Error naming the file; the temporary file is removed and a previous file at
// <path> is never touched. A failure that only some ranks see outside the writer's own calls (an
// exception in the caller's code on one rank) cannot be recovered collectively: don't do that.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <atomic>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/h5file.h"

namespace zp::io {

class DirectFile;
constexpr int64_t kCheckpointFormat = 1;

// CRC-32 as zlib computes it (IEEE polynomial, reflected; computed by libdeflate): crc32(b, n,
// crc32(a, m)) continues a run.
uint32_t crc32(const void* data, size_t bytes, uint32_t crc = 0);

// One row of a dataset's slice_checksums: elements [offset, offset + count) as written by one rank.
struct SliceChecksum {
  int64_t offset, count;
  uint32_t crc;
};

class CheckpointWriter {
 public:
  // Collective. Creates <path>.tmp (and missing parent directories), replacing a stale one.
  explicit CheckpointWriter(const std::string& path, MPI_Comm comm = MPI_COMM_NULL);
  ~CheckpointWriter();  // not committed: closes and removes the temporary file
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  const std::string& path() const { return path_; }
  std::string tmp_path() const { return temporary_path(path_); }
  // For attributes: collective, identical values on every rank.
  H5File& file() { return file_; }

  // Collective. Creates dataset `name` (stored as `file_dtype`, full logical `shape`) on the first
  // call for that name, then writes elements [offset, offset+count) of its flattened data from `data`
  // (`count` elements of `mem_dtype`; count may be 0). A rank may write several ranges of a dataset
  // over several calls, but every rank must make every call.
  void write(const std::string& name, DType file_dtype, const Shape& shape, DType mem_dtype, const void* data,
             int64_t offset, int64_t count, const Shape& chunk = {});
  // Asynchronous saves (runtime/checkpoint.h). Collective like write(), which it is for a chunked
  // dataset or another dtype in memory; for a contiguous one it creates the dataset now and leaves
  // the data to start_writing(): `data` must stay valid and unchanged until commit() returns or the
  // writer is destroyed.
  void write_later(const std::string& name, DType file_dtype, const Shape& shape, DType mem_dtype, const void* data,
                   int64_t offset, int64_t count);
  // Local. Starts a thread that writes what write_later() left, in order, with its checksums; it
  // calls neither MPI nor HDF5, so the caller may go on with both, and runs at a lower priority
  // (nice 10) than the caller's threads. No write() after this.
  void start_writing();
  // Local: the thread started by start_writing() is done (or none was started).
  bool written() const;
  // Collective: waits for the thread, then checksums, flush, close, fsync, rename. Throws zp::Error
  // (on every rank) on failure, a failure of the thread included.
  void commit();
  // Collective. Reserves `bytes` (the file's approximate final size) on disk for the temporary file
  // now, so that a disk too full for the checkpoint fails here, with a clear error, before any data
  // or HDF5 metadata is written (a failed metadata write is what HDF5 1.10 handles worst); what is not
  // used is released at commit. File systems without fallocate skip the reservation.
  void reserve(int64_t bytes);
  bool committed() const { return committed_; }

 private:
  using Slice = SliceChecksum;
  void discard();  // closes quietly and removes the temporary file (rank 0)
  template <class F> void agreed(F&& step);
  std::string explain(const std::string& what) const;

  std::string path_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  H5File file_;
  std::vector<std::string> order_;  // datasets in creation order (identical on every rank)
  std::map<std::string, std::vector<Slice>> slices_;
  bool committed_ = false, discarded_ = false;
  int64_t expected_bytes_ = 0;  // reserve()'d, for the message of a full disk
  std::unique_ptr<DirectFile> data_;  // the data path (io/direct_file.h), opened at the first write
  int copy_threads_ = 1;              // its threads for copy and CRC
  struct Later {  // a write_later() for the thread
    std::string name;
    const void* data;
    int64_t file_offset, offset, count, bytes;
  };
  std::vector<Later> later_;
  std::thread writing_;
  std::atomic<bool> written_{true};
  std::string writing_error_;  // the thread's failure, read after joining it
  void join_writing();
};

// A file that is not what it claims to be: not HDF5, truncated, without its ZeRO-Pipe attributes, or
// holding data whose checksum fails. As opposed to an intact file of another model (a plain
// zp::Error): `--resume latest` skips a damaged checkpoint for an older one, never a mismatched one.
struct DamagedFileError : Error {
  using Error::Error;
};

// Verified reads. Every read checks the CRC of each recorded slice it touches: the requested range
// is widened to the slices' bounds (widening costs nothing when the reader owns what the writer
// owned, i.e. the same world size; otherwise at most one slice on either side), the widened range is
// read in pieces of at most 64 MiB, and a mismatch, or a requested element no writer recorded,
// throws DamagedFileError naming the file, dataset and element range. A file whose root says
// checksum = "crc32" (everything ZeRO-Pipe writes) must carry slice_checksums on every dataset read.
// In parallel mode the ranks agree on the number of collective reads and on the outcome, so either
// every rank returns or every rank throws the same error.
class CheckpointReader {
 public:
  // Collective in parallel mode. Throws DamagedFileError naming the file when it is not HDF5, damaged
  // or not a ZeRO-Pipe file of a format this build reads, and zp::Error when it does not exist.
  explicit CheckpointReader(const std::string& path, MPI_Comm comm = MPI_COMM_NULL);
  ~CheckpointReader();
  const H5File& file() const { return file_; }
  const std::string& path() const { return file_.path(); }
  int64_t format() const { return format_; }
  bool contains(const std::string& name) const { return file_.is_dataset(name); }
  DatasetInfo info(const std::string& name) const { return file_.dataset_info(name); }
  // Collective. Reads elements [offset, offset+count) of the flattened dataset `name` as `mem_dtype`,
  // verified. Throws zp::Error naming file and dataset when it is missing, its shape is not
  // `expected_shape`, or its dtype cannot be read as `mem_dtype`; DamagedFileError as above.
  void read(const std::string& name, const Shape& expected_shape, DType mem_dtype, void* data, int64_t offset,
            int64_t count) const;
  struct ReadRequest {
    std::string name;
    Shape expected_shape;
    DType mem_dtype;
    void* data;
    int64_t offset, count;
  };
  // Collective. read() of every request, in order, with the same checks and errors (the first
  // problem is thrown after all have been read), but the datasets' bytes stream from the disk as one
  // sequence: the next dataset's first piece is read while this one's last is checked and copied out.
  // Every rank passes requests for the same datasets in the same order.
  void read_all(const std::vector<ReadRequest>& requests) const;
  // Serial. Streams the whole dataset in order as `mem_dtype`, in pieces of at most `piece` elements:
  // consume(data, offset, count). A slice is verified when its last piece has been read, so pieces
  // handed out before a DamagedFileError come from a damaged file: the caller must discard what it
  // made of them (convert writes to a temporary file).
  void stream(const std::string& name, DType mem_dtype, int64_t piece,
              const std::function<void(const void* data, int64_t offset, int64_t count)>& consume) const;
  // Bytes of dataset data read from the file so far by read() and stream(), as stored: a read's
  // widening to the checksum slices included.
  int64_t bytes_read() const { return bytes_read_; }

 private:
  using Slice = SliceChecksum;
  const std::vector<Slice>& slices(const std::string& name, const DatasetInfo& info) const;
  // A checksummed read checked and widened to its slices' bounds: [lo, hi) to read (empty after a
  // problem), and the consume() that copies the requested part out as the request's dtype.
  struct PlannedRead {
    std::string name;
    DatasetInfo info;
    int64_t lo = 0, hi = 0;
    std::string problem;
    std::function<void(const char* raw, int64_t offset, int64_t count)> consume;
  };
  PlannedRead plan_read(const ReadRequest& r) const;
  // Dataset `n`'s info; throws when its shape is not `expected_shape`.
  DatasetInfo shaped_info(const std::string& n, const Shape& expected_shape) const;
  // A file without checksums (written by another tool): the request read through HDF5 as it is.
  void read_unverified(const ReadRequest& r) const;
  // Reads [lo, hi) of `name` (slice bounds) in pieces, checks every slice in it and hands each piece
  // to `consume` as stored (file dtype). Returns the first problem found ("" if none).
  // With `threads` > 1, consume may be called from that many threads at once, on disjoint ranges.
  std::string scan(const std::string& name, const DatasetInfo& info, int64_t lo, int64_t hi, int64_t piece,
                   const std::function<void(const char* raw, int64_t offset, int64_t count)>& consume,
                   int threads = 1) const;

  H5File file_;
  int64_t format_ = 0;
  bool checksummed_ = false;
  mutable std::map<std::string, std::vector<Slice>> slices_;
  mutable std::unique_ptr<DirectFile> data_;  // the data path (io/direct_file.h), opened at the first read
  int copy_threads_ = 1;                      // read()'s threads for copy and CRC
  mutable int64_t bytes_read_ = 0;
};

struct ChecksumReport {
  int64_t datasets = 0;   // datasets that carry slice checksums
  int64_t slices = 0;     // slices re-read and compared
  int64_t unchecked = 0;  // datasets without checksums (written by another tool)
  std::vector<std::string> problems;  // one line per mismatch, gap or overlap
  bool ok() const { return problems.empty(); }
};

// Re-reads every recorded slice and compares its CRC; collective over comm (the slices are spread
// over the ranks), and every rank gets the full report.
ChecksumReport verify_checksums(const std::string& path, MPI_Comm comm = MPI_COMM_NULL);

// Opens `path` and reads every attribute and dataset description, in a child process: libhdf5 1.10
// trusts some sizes inside a damaged file and can crash the process reading them (a global heap
// object's size, under a string attribute), which must not take a training job down when an older
// checkpoint would do. Returns "" when the child got through, else what went wrong (the child's
// zp::Error, or the signal that ended it). Serial; the child uses neither MPI nor CUDA.
std::string probe_metadata(const std::string& path);

// A printable summary of any HDF5 file (serial): groups, datasets with dtype, shape and layout,
// attributes (strings in full, so the config JSON shows), and with `verify` the checksum report.
std::string inspect(const std::string& path, bool verify);

// Rotation. Checkpoints are named <prefix><step, 8+ digits>.h5 ("step-00000123.h5"); a
// <name>.h5.tmp is never complete and never listed.
std::string checkpoint_filename(int64_t step, const std::string& prefix = "step-");
struct CheckpointEntry {
  int64_t step = 0;
  std::string path;
};
std::vector<CheckpointEntry> list_checkpoints(const std::string& dir, const std::string& prefix = "step-");
// The newest complete checkpoint, if any.
std::optional<std::string> latest_checkpoint(const std::string& dir, const std::string& prefix = "step-");
// Deletes all but the newest `keep` (>= 1) checkpoints. Collective: rank 0 deletes, then a barrier.
// Returns the deleted paths (on rank 0; empty elsewhere).
std::vector<std::string> keep_last_checkpoints(const std::string& dir, const std::string& prefix, int keep,
                                               MPI_Comm comm = MPI_COMM_NULL);

}  // namespace zp::io
