// A thin RAII wrapper over the HDF5 C API: one file, opened serially or for parallel access through
// MPI-IO, with datasets addressed by path ("/model/h.0.attn.weight") and read or written by
// contiguous ranges of their FLATTENED data, which is how ZeRO shards a parameter (a rank owns a
// contiguous 1/N of every flat buffer). HDF5 cannot reshape, so a flat range is turned into a union
// of n-d hyperslab blocks (see flat_range_hyperslabs).
//
// Parallel use (a communicator with more than one rank): every call that touches the file's
// structure or metadata (create, create_group, create_dataset, set_attr_*, flush, close) is
// collective and must be made by every rank with identical arguments; write_slice and read_slice are
// collective too (MPI-IO collective transfers) but each rank passes its own range, possibly empty.
// Queries (exists, dataset_info, attributes, children) are local. Writes use MPI-IO collective
// (two-phase) I/O. Reads are collective HDF5 calls that MPI-IO serves with independent reads
// (H5FD_MPIO_INDIVIDUAL_IO): Open MPI 4.1.4's ompio returns wrong data from collective reads whose
// ranges overlap between ranks (e.g. rank 0 reads elements [0, 91) while rank 1 reads [10, 15)),
// which is exactly what loading with another world size or replicated weights does; romio is
// correct either way. A rank's range of a contiguous dataset is one contiguous file region, so
// aggregation would gain little for reads.
//
// Errors: a file the user handed us that is missing, not HDF5, truncated, or lacks the expected
// dataset, shape or dtype throws zp::Error naming the file and the object, with HDF5's own error stack
// appended; so does a failed write (ENOSPC, EFBIG), so that callers can clean up. HDF5's automatic
// error printing is switched off around our calls because every message already carries the stack.
// Broken invariants inside this wrapper (a dataspace that cannot be created) abort via ZP_H5_CHECK.
//
// Types on disk: f32/f64/i32/i64/u8 are the standard little-endian HDF5 types. f16 and bf16 are
// user-defined 16-bit HDF5 floats (sign bit 15; f16: 5 exponent bits at 10, bias 15, 10 mantissa
// bits; bf16: 8 exponent bits at 7, bias 127, 7 mantissa bits). HDF5 converts them to any other float
// type, so h5py 3.7 reads the f16 one as numpy float16 and the bf16 one as numpy float32 (exactly).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace zp::io {

// Agreement on failure, for code where every rank must leave a collective sequence together: each
// rank passes its own error ("" for none); returns "" on every rank when none failed, else, on every
// rank, the message of the lowest failing rank (others' copies end "[reported by rank R]"). `comm`
// null or of one rank: returns `mine`.
std::string first_error(MPI_Comm comm, const std::string& mine);

// One n-d block of a hyperslab selection: start and count per dimension.
struct HyperslabBlock {
  std::vector<int64_t> start, count;
  bool operator==(const HyperslabBlock&) const = default;
};

// Elements [offset, offset+count) of a row-major array of `shape`, as disjoint n-d blocks in flat
// order, each of which is itself a contiguous flat range. At most 2*ndim-1 blocks: at each level a
// partial leading row (recursing one dimension down), a block of whole rows, a partial trailing row.
// A scalar shape ({}) gives one block with empty start/count; count == 0 gives no blocks.
std::vector<HyperslabBlock> flat_range_hyperslabs(const Shape& shape, int64_t offset, int64_t count);

struct DatasetInfo {
  DType dtype = DType::F32;
  Shape shape;               // logical shape ({} for a scalar dataset)
  Shape chunk;               // empty when the layout is contiguous
  int64_t file_offset = -1;  // byte address of a contiguous dataset's data in the file, else -1
  int64_t numel() const { return shape_numel(shape); }
};

enum class AttrKind { String, Int64, Double, Bytes, Int64Array, Other };

class H5File {
 public:
  // comm == MPI_COMM_NULL, a communicator of one rank, or MPI not initialised: serial (POSIX driver);
  // otherwise parallel through MPI-IO, collective over comm.
  // Creates (truncating) a file for writing. Throws zp::Error naming the file on failure.
  static H5File create(const std::string& path, MPI_Comm comm = MPI_COMM_NULL);
  // Opens an existing file; throws zp::Error when it is missing, not HDF5 or damaged.
  static H5File open(const std::string& path, bool writable = false, MPI_Comm comm = MPI_COMM_NULL);

  H5File() = default;
  ~H5File();  // closes quietly; call close() to see errors
  H5File(H5File&& o) noexcept;
  H5File& operator=(H5File&& o) noexcept;
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;

  bool is_open() const { return id_ >= 0; }
  const std::string& path() const { return path_; }
  bool parallel() const { return parallel_; }
  MPI_Comm comm() const { return comm_; }

  void flush();  // collective; throws zp::Error on failure (e.g. no space left)
  void close();  // collective; throws zp::Error on failure; the handle is closed either way

  // --- structure ---
  bool exists(const std::string& path) const;  // a group or dataset at `path`
  bool is_group(const std::string& path) const;
  bool is_dataset(const std::string& path) const;
  void create_group(const std::string& path);  // creates missing parents; no-op if it exists
  // Names of the links in a group, sorted.
  std::vector<std::string> children(const std::string& group) const;
  // The identity of the object at `path` (its address in the file): two links to one object give
  // the same value, which is how a walker notices a hard-link cycle (a hostile file can make one).
  // Throws naming file and object when it is missing or its header cannot be read.
  uint64_t object_id(const std::string& path) const;

  // --- datasets ---
  // Creates a dataset of `shape` stored as `dtype` (parents created on demand). `chunk` empty gives
  // a contiguous layout; storage is allocated at creation and never filled, so only written ranges
  // hold data.
  void create_dataset(const std::string& path, DType dtype, const Shape& shape, const Shape& chunk = {});
  DatasetInfo dataset_info(const std::string& path) const;  // throws naming file and dataset
  // Writes/reads elements [flat_offset, flat_offset+count) of the flattened dataset from/to `data`
  // holding `count` elements of `mem_dtype`. Float types convert to and from any float type on the
  // fly (rounding to nearest even); integer types must match. Collective in parallel mode; count may
  // be 0 on any rank.
  void write_slice(const std::string& path, DType mem_dtype, const void* data, int64_t flat_offset, int64_t count);
  void read_slice(const std::string& path, DType mem_dtype, void* data, int64_t flat_offset, int64_t count) const;

  // --- attributes on any group or dataset ("/" is the root); setting replaces ---
  void set_attr_string(const std::string& obj, const std::string& name, const std::string& value);
  void set_attr_int(const std::string& obj, const std::string& name, int64_t value);
  void set_attr_double(const std::string& obj, const std::string& name, double value);
  void set_attr_bytes(const std::string& obj, const std::string& name, const std::vector<uint8_t>& value);
  // An int64 array of `shape` (empty: 1-d of values.size()).
  void set_attr_ints(const std::string& obj, const std::string& name, const std::vector<int64_t>& values,
                     const Shape& shape = {});
  bool has_attr(const std::string& obj, const std::string& name) const;
  std::vector<std::string> attr_names(const std::string& obj) const;  // sorted
  AttrKind attr_kind(const std::string& obj, const std::string& name) const;
  Shape attr_shape(const std::string& obj, const std::string& name) const;  // {} for a scalar
  // Readers throw zp::Error naming file, object and attribute when it is missing or of another kind.
  std::string attr_string(const std::string& obj, const std::string& name) const;
  int64_t attr_int(const std::string& obj, const std::string& name) const;
  double attr_double(const std::string& obj, const std::string& name) const;
  std::vector<uint8_t> attr_bytes(const std::string& obj, const std::string& name) const;
  std::vector<int64_t> attr_ints(const std::string& obj, const std::string& name) const;  // flattened

  // Largest transfer handed to one H5Dwrite/H5Dread (MPI-IO counts are 32-bit ints); larger ranges
  // are split into several collective calls. Also bounds the conversion buffer. Lowered by tests.
  void set_max_io_bytes(size_t bytes) { max_io_bytes_ = bytes; }

 private:
  H5File(int64_t id, std::string path, MPI_Comm comm, bool parallel)
      : id_(id), path_(std::move(path)), comm_(comm), parallel_(parallel) {}
  void transfer(bool write, const std::string& path, DType mem_dtype, void* data, int64_t flat_offset,
                int64_t count) const;
  void set_attr_raw(const std::string& obj, const std::string& name, int64_t type, int64_t space,
                    const void* data);
  [[noreturn]] void fail(const std::string& what) const;  // throws naming this file + HDF5's stack

  int64_t id_ = -1;  // hid_t
  std::string path_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool parallel_ = false;
  size_t max_io_bytes_ = size_t(1) << 30;
};

}  // namespace zp::io
