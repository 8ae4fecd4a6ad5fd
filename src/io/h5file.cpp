// The one non-obvious part is transfer(): a flat range becomes a union of hyperslab blocks (OR-ed
// selections iterate in the dataspace's row-major order, which is the flat order, so a 1-d memory
// space of `count` elements lines up), and in parallel mode every rank must make the same number of
// collective H5Dwrite/H5Dread calls even when its range is empty, is split into pieces, or fails:
// ranks agree on the piece count and on failures with small all-reduces around the I/O.
#include "io/h5file.h"

#include <hdf5.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <type_traits>

#include "core/error.h"
#include "core/fault_injection.h"
#include "kernels/elementwise.h"

namespace zp::io {

// The HDF5 error stack, innermost message first.
std::string h5_error_string() {
  std::string out;
  auto walk = [](unsigned n, const H5E_error2_t* e, void* data) -> herr_t {
    auto* s = static_cast<std::string*>(data);
    if (!s->empty()) *s += " <- ";
    *s += e->desc ? e->desc : "?";
    if (e->func_name) { *s += " in "; *s += e->func_name; }
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk, &out);
  return out.empty() ? "HDF5 call failed (no error stack)" : out;
}


// A broken invariant of this wrapper (not bad input): fatal, with HDF5's own message.
#define ZP_H5_CHECK(call)                                          \
  do {                                                             \
    if ((call) < 0) ZP_FATAL(#call ": ", h5_error_string());       \
  } while (0)
namespace fs = std::filesystem;

static_assert(std::is_same_v<hid_t, int64_t>, "H5File stores hid_t as int64_t");
static_assert(std::endian::native == std::endian::little, "file types are little-endian; so is memory");

namespace {

// Switches HDF5's automatic error printing off for the scope: failures are reported through our
// exceptions, which carry h5_error_string().
class QuietErrors {
 public:
  QuietErrors() {
    ZP_H5_CHECK(H5Eget_auto2(H5E_DEFAULT, &func_, &data_));
    ZP_H5_CHECK(H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr));
  }
  ~QuietErrors() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }  // restoring what we read cannot fail
  QuietErrors(const QuietErrors&) = delete;
  QuietErrors& operator=(const QuietErrors&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// An owned HDF5 identifier of any kind, closed by the matching H5?close.
class Hid {
 public:
  Hid() = default;
  explicit Hid(hid_t id) : id_(id) {}
  ~Hid() { reset(); }
  Hid(Hid&& o) noexcept : id_(o.id_) { o.id_ = -1; }
  Hid& operator=(Hid&& o) noexcept {
    if (this != &o) { reset(); id_ = o.id_; o.id_ = -1; }
    return *this;
  }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset() {
    if (id_ < 0) return;
    switch (H5Iget_type(id_)) {
      case H5I_FILE: H5Fclose(id_); break;
      case H5I_GROUP: H5Gclose(id_); break;
      case H5I_DATASET: H5Dclose(id_); break;
      case H5I_DATASPACE: H5Sclose(id_); break;
      case H5I_DATATYPE: H5Tclose(id_); break;
      case H5I_ATTR: H5Aclose(id_); break;
      case H5I_GENPROP_LST: H5Pclose(id_); break;
      default: H5Idec_ref(id_); break;
    }
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
};

// A library call that can only fail on a broken invariant (not on user input) aborts.
hid_t checked(hid_t id, const char* what) {
  if (id < 0) ZP_FATAL(what, ": ", h5_error_string());
  return id;
}

// HDF5's error stack on one line (its file-driver messages embed a ctime() newline).
std::string h5_stack() {
  std::string s = h5_error_string();
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

bool mpi_active() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

bool use_parallel(MPI_Comm comm) {
  if (comm == MPI_COMM_NULL || !mpi_active()) return false;
  int size = 1;
  ZP_MPI_CHECK(MPI_Comm_size(comm, &size));
  return size > 1;
}

std::string norm_path(const std::string& p) {
  std::string n = p.empty() || p[0] != '/' ? "/" + p : p;
  while (n.size() > 1 && n.back() == '/') n.pop_back();
  return n;
}

// The HDF5 type of a DType, used both in the file and in memory (we only build little-endian).
Hid make_type(DType dt) {
  auto copy = [](hid_t t) { return Hid(checked(H5Tcopy(t), "H5Tcopy")); };
  auto half = [&](size_t epos, size_t esize, size_t msize, size_t ebias) {
    Hid t = copy(H5T_IEEE_F32LE);
    ZP_H5_CHECK(H5Tset_fields(t.get(), 15, epos, esize, 0, msize));
    ZP_H5_CHECK(H5Tset_precision(t.get(), 16));
    ZP_H5_CHECK(H5Tset_size(t.get(), 2));
    ZP_H5_CHECK(H5Tset_ebias(t.get(), ebias));
    return t;
  };
  switch (dt) {
    case DType::F32: return copy(H5T_IEEE_F32LE);
    case DType::F64: return copy(H5T_IEEE_F64LE);
    case DType::BF16: return half(7, 8, 7, 127);
    case DType::F16: return half(10, 5, 10, 15);
    case DType::I32: return copy(H5T_STD_I32LE);
    case DType::I64: return copy(H5T_STD_I64LE);
    case DType::U8: return copy(H5T_STD_U8LE);
  }
  ZP_FATAL("unknown dtype");
}

// The DType of a file type, or an empty string and a description of what it is instead.
bool dtype_of_h5(hid_t t, DType* out, std::string* what) {
  H5T_class_t cls = H5Tget_class(t);
  size_t size = H5Tget_size(t);
  if (cls == H5T_FLOAT) {
    if (size == 8) { *out = DType::F64; return true; }
    if (size == 4) { *out = DType::F32; return true; }
    if (size == 2) {
      size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
      if (H5Tget_fields(t, &spos, &epos, &esize, &mpos, &msize) < 0) {
        *what = "a 16-bit float whose bit fields cannot be read";
        return false;
      }
      size_t ebias = H5Tget_ebias(t);
      if (esize == 8 && msize == 7 && ebias == 127) { *out = DType::BF16; return true; }
      if (esize == 5 && msize == 10 && ebias == 15) { *out = DType::F16; return true; }
      *what = detail::cat("a 16-bit float with ", esize, " exponent and ", msize, " mantissa bits");
      return false;
    }
    *what = detail::cat("a ", size * 8, "-bit float");
    return false;
  }
  if (cls == H5T_INTEGER) {
    bool is_signed = H5Tget_sign(t) == H5T_SGN_2;
    if (size == 1 && !is_signed) { *out = DType::U8; return true; }
    if (size == 4 && is_signed) { *out = DType::I32; return true; }
    if (size == 8 && is_signed) { *out = DType::I64; return true; }
    *what = detail::cat("a ", size * 8, "-bit ", is_signed ? "signed" : "unsigned", " integer");
    return false;
  }
  *what = detail::cat("HDF5 type class ", int(cls));
  return false;
}

std::vector<hsize_t> to_hsize(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

// The element count of `dims`, or -1 when it (or a dimension) does not fit int64: only a damaged or
// hostile file holds such a dataspace, and a wrapped count would pass every later range check.
// (`dims`: hsize_t from a file, or a Shape whose dimensions are known to be non-negative.)
template <class Dims> int64_t checked_numel(const Dims& dims) {
  uint64_t n = 1;
  for (uint64_t d : dims)
    if (d > uint64_t(INT64_MAX) || __builtin_mul_overflow(n, uint64_t(d), &n)) return -1;
  return n > uint64_t(INT64_MAX) ? -1 : int64_t(n);
}

std::string dims_str(const std::vector<hsize_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// The dimensions of a simple or scalar dataspace; throws `fail_with` when HDF5 cannot report them or
// they are more than H5S_MAX_RANK (what HDF5 itself can create).
template <class Fail> std::vector<hsize_t> space_dims(hid_t space, Fail&& fail_with) {
  int nd = H5Sget_simple_extent_ndims(space);
  if (nd < 0) fail_with("cannot read its rank");
  if (nd > H5S_MAX_RANK) fail_with("has rank " + std::to_string(nd) + ", more than HDF5's " + std::to_string(H5S_MAX_RANK));
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  if (nd > 0 && H5Sget_simple_extent_dims(space, dims.data(), nullptr) < 0) fail_with("cannot read its dimensions");
  return dims;
}

Hid make_space(const Shape& shape) {
  if (shape.empty()) return Hid(checked(H5Screate(H5S_SCALAR), "H5Screate"));
  auto dims = to_hsize(shape);
  return Hid(checked(H5Screate_simple(int(dims.size()), dims.data(), nullptr), "H5Screate_simple"));
}

Hid intermediate_groups_lcpl() {
  Hid lcpl(checked(H5Pcreate(H5P_LINK_CREATE), "H5Pcreate"));
  ZP_H5_CHECK(H5Pset_create_intermediate_group(lcpl.get(), 1));
  return lcpl;
}

void decompose(const Shape& shape, size_t dim, int64_t a, int64_t b, std::vector<int64_t>& prefix,
               std::vector<HyperslabBlock>& out) {
  const size_t nd = shape.size();
  auto block = [&](int64_t row0, int64_t rows) {  // rows [row0, row0+rows) of dim, whole below
    HyperslabBlock blk;
    blk.start = prefix;
    blk.count.assign(prefix.size(), 1);
    blk.start.push_back(row0);
    blk.count.push_back(rows);
    for (size_t d = dim + 1; d < nd; ++d) { blk.start.push_back(0); blk.count.push_back(shape[d]); }
    out.push_back(std::move(blk));
  };
  if (dim + 1 == nd) { block(a, b - a); return; }
  int64_t inner = 1;
  for (size_t d = dim + 1; d < nd; ++d) inner *= shape[d];
  int64_t first = a / inner, last = (b - 1) / inner;
  auto within_row = [&](int64_t row, int64_t lo, int64_t hi) {
    prefix.push_back(row);
    decompose(shape, dim + 1, lo, hi, prefix, out);
    prefix.pop_back();
  };
  if (first == last) { within_row(first, a - first * inner, b - first * inner); return; }
  int64_t full_begin = first, full_end = last + 1;
  if (a % inner != 0) { within_row(first, a % inner, inner); full_begin = first + 1; }
  bool tail = b % inner != 0;
  if (tail) full_end = last;
  if (full_end > full_begin) block(full_begin, full_end - full_begin);
  if (tail) within_row(last, 0, b - last * inner);
}

}  // namespace

std::vector<HyperslabBlock> flat_range_hyperslabs(const Shape& shape, int64_t offset, int64_t count) {
  int64_t n = shape_numel(shape);
  ZP_REQUIRE(offset >= 0 && count >= 0 && offset + count <= n, "flat range [", offset, ", ", offset + count,
             ") outside an array of shape ", shape_str(shape), " (", n, " elements)");
  std::vector<HyperslabBlock> out;
  if (count == 0) return out;
  if (shape.empty()) return {HyperslabBlock{}};
  std::vector<int64_t> prefix;
  decompose(shape, 0, offset, offset + count, prefix, out);
  return out;
}

// ---------------------------------------------------------------------------------------------
// H5File

void H5File::fail(const std::string& what) const {
  std::string stack = h5_stack();  // before any other HDF5 call clears the stack
  throw Error(path_ + ": " + what + " (HDF5: " + stack + ")");
}

static Hid make_fapl(bool parallel, MPI_Comm comm) {
  Hid fapl(checked(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate"));
  // The 1.8 object header format stores attributes larger than 64 KiB (long config JSON).
  ZP_H5_CHECK(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST));
  if (parallel) ZP_H5_CHECK(H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL));
  return fapl;
}

H5File H5File::create(const std::string& path, MPI_Comm comm) {
  QuietErrors quiet;
  bool par = use_parallel(comm);
  Hid fapl = make_fapl(par, comm);
  // Datasets of 64 KiB and more start on a 4 KiB page, so that their data can move with O_DIRECT
  // from their first byte (io/direct_file.h); what this costs is under a page per dataset.
  ZP_H5_CHECK(H5Pset_alignment(fapl.get(), 64 << 10, 4096));
  hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());
  if (id < 0) {
    std::string stack = h5_stack();
    throw Error(path + ": cannot create HDF5 file (HDF5: " + stack + ")");
  }
  return H5File(id, path, comm, par);
}

H5File H5File::open(const std::string& path, bool writable, MPI_Comm comm) {
  QuietErrors quiet;
  std::error_code ec;
  ZP_REQUIRE(fs::exists(path, ec), path, ": no such file");
  ZP_REQUIRE(fs::is_regular_file(path, ec), path, ": not a regular file");
  htri_t is_h5 = H5Fis_hdf5(path.c_str());
  if (is_h5 <= 0) {
    std::string stack = is_h5 < 0 ? " (HDF5: " + h5_stack() + ")" : "";
    throw Error(path + ": not an HDF5 file (no HDF5 signature)" + stack);
  }
  bool par = use_parallel(comm);
  Hid fapl = make_fapl(par, comm);
  hid_t id = H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, fapl.get());
  if (id < 0) {
    std::string stack = h5_stack();
    throw Error(path + ": cannot open HDF5 file, damaged or truncated? (HDF5: " + stack + ")");
  }
  return H5File(id, path, comm, par);
}

H5File::~H5File() {
  if (id_ < 0) return;
  QuietErrors quiet;
  H5Fclose(id_);
}

H5File::H5File(H5File&& o) noexcept
    : id_(o.id_), path_(std::move(o.path_)), comm_(o.comm_), parallel_(o.parallel_), max_io_bytes_(o.max_io_bytes_) {
  o.id_ = -1;
}

H5File& H5File::operator=(H5File&& o) noexcept {
  if (this == &o) return *this;
  if (id_ >= 0) {
    QuietErrors quiet;
    H5Fclose(id_);
  }
  id_ = o.id_;
  path_ = std::move(o.path_);
  comm_ = o.comm_;
  parallel_ = o.parallel_;
  max_io_bytes_ = o.max_io_bytes_;
  o.id_ = -1;
  return *this;
}

void H5File::flush() {
  ZP_REQUIRE(is_open(), path_, ": flush of a closed file");
  QuietErrors quiet;
  if (H5Fflush(id_, H5F_SCOPE_GLOBAL) < 0) fail("cannot flush");
}

void H5File::close() {
  if (id_ < 0) return;
  QuietErrors quiet;
  hid_t id = id_;
  id_ = -1;
  if (H5Fclose(id) < 0) fail("cannot close (data may not have reached the disk)");
}

// --- structure ---------------------------------------------------------------------------------

bool H5File::exists(const std::string& path) const {
  ZP_REQUIRE(is_open(), path_, ": query of a closed file");
  QuietErrors quiet;
  std::string n = norm_path(path);
  if (n == "/") return true;
  // H5Lexists needs every parent to exist, so walk down one link at a time.
  for (size_t pos = 1;;) {
    size_t next = n.find('/', pos);
    std::string prefix = n.substr(0, next);
    if (H5Lexists(id_, prefix.c_str(), H5P_DEFAULT) <= 0) return false;  // < 0: a parent is a dataset
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  return H5Oexists_by_name(id_, n.c_str(), H5P_DEFAULT) > 0;
}

static H5I_type_t object_type(hid_t file, const std::string& n) {
  Hid obj(H5Oopen(file, n.c_str(), H5P_DEFAULT));
  return obj.valid() ? H5Iget_type(obj.get()) : H5I_BADID;
}

bool H5File::is_group(const std::string& path) const {
  if (!exists(path)) return false;
  QuietErrors quiet;
  return object_type(id_, norm_path(path)) == H5I_GROUP;
}

bool H5File::is_dataset(const std::string& path) const {
  if (!exists(path)) return false;
  QuietErrors quiet;
  return object_type(id_, norm_path(path)) == H5I_DATASET;
}

void H5File::create_group(const std::string& path) {
  std::string n = norm_path(path);
  if (exists(n)) {
    ZP_REQUIRE(is_group(n), path_, ": cannot create group '", n, "': a dataset of that name exists");
    return;
  }
  QuietErrors quiet;
  Hid lcpl = intermediate_groups_lcpl();
  Hid g(H5Gcreate2(id_, n.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!g.valid()) fail("cannot create group '" + n + "'");
}

std::vector<std::string> H5File::children(const std::string& group) const {
  std::string n = norm_path(group);
  ZP_REQUIRE(is_group(n), path_, ": no group '", n, "'");
  QuietErrors quiet;
  Hid g(H5Gopen2(id_, n.c_str(), H5P_DEFAULT));
  if (!g.valid()) fail("cannot open group '" + n + "'");
  std::vector<std::string> names;
  auto collect = [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  if (H5Literate(g.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect, &names) < 0)
    fail("cannot list group '" + n + "'");
  std::sort(names.begin(), names.end());
  return names;
}

uint64_t H5File::object_id(const std::string& path) const {
  std::string n = norm_path(path);
  ZP_REQUIRE(exists(n), path_, ": no object '", n, "'");
  QuietErrors quiet;
#if H5_VERSION_GE(1, 12, 0)
  H5O_info2_t info;
  if (H5Oget_info_by_name3(id_, n.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0)
    fail("cannot read the object header of '" + n + "'");
  uint64_t id = 0;  // the native file format's token begins with the object's address
  std::memcpy(&id, &info.token, std::min(sizeof id, sizeof info.token));
  return id;
#else
  H5O_info_t info;
  if (H5Oget_info_by_name2(id_, n.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0)
    fail("cannot read the object header of '" + n + "'");
  return uint64_t(info.addr);
#endif
}

// --- datasets ----------------------------------------------------------------------------------

void H5File::create_dataset(const std::string& path, DType dtype, const Shape& shape, const Shape& chunk) {
  std::string n = norm_path(path);
  auto where = [&] { return path_ + ": dataset '" + n + "': "; };
  ZP_REQUIRE(!exists(n), where(), "cannot create, it already exists");
  // HDF5 aborts inside H5Screate_simple (checked) on more dimensions than it supports.
  ZP_REQUIRE(shape.size() <= size_t(H5S_MAX_RANK), where(), "shape ", shape_str(shape), " has ", shape.size(),
             " dimensions, HDF5 supports at most ", H5S_MAX_RANK);
  for (int64_t d : shape) ZP_REQUIRE(d >= 0, where(), "negative dimension in shape ", shape_str(shape));
  ZP_REQUIRE(checked_numel(shape) >= 0, where(), "shape ", shape_str(shape),
             " has more elements than 64-bit sizes can count");
  bool chunked = !chunk.empty() && shape_numel(shape) > 0;
  if (chunked) {
    ZP_REQUIRE(chunk.size() == shape.size(), where(), "chunk ", shape_str(chunk), " does not match shape ",
               shape_str(shape));
    for (size_t i = 0; i < chunk.size(); ++i)
      ZP_REQUIRE(chunk[i] >= 1 && chunk[i] <= shape[i], where(), "chunk ", shape_str(chunk),
                 " must be within 1..shape ", shape_str(shape));
    // HDF5's own limits, which H5Pset_chunk (checked) would otherwise abort on.
    uint64_t chunk_bytes = dtype_size(dtype);
    for (int64_t c : chunk)
      ZP_REQUIRE(c < (int64_t(1) << 32) && !__builtin_mul_overflow(chunk_bytes, uint64_t(c), &chunk_bytes), where(),
                 "chunk ", shape_str(chunk), " is larger than HDF5 allows");
    ZP_REQUIRE(chunk_bytes < (uint64_t(1) << 32), where(), "chunk ", shape_str(chunk), " of ", dtype_name(dtype),
               " is ", chunk_bytes, " bytes, HDF5 allows less than 4 GiB");
  }
  QuietErrors quiet;
  Hid space = make_space(shape);
  Hid type = make_type(dtype);
  Hid dcpl(checked(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate"));
  // Every element is written by some rank; filling first would write the whole file twice.
  ZP_H5_CHECK(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER));
  ZP_H5_CHECK(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY));
  if (chunked) {
    auto c = to_hsize(chunk);
    ZP_H5_CHECK(H5Pset_chunk(dcpl.get(), int(c.size()), c.data()));
  }
  Hid lcpl = intermediate_groups_lcpl();
  Hid d(H5Dcreate2(id_, n.c_str(), type.get(), space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT));
  if (!d.valid()) fail("cannot create dataset '" + n + "' " + std::string(dtype_name(dtype)) + shape_str(shape));
}

DatasetInfo H5File::dataset_info(const std::string& path) const {
  std::string n = norm_path(path);
  auto where = [&] { return path_ + ": dataset '" + n + "': "; };
  ZP_REQUIRE(is_dataset(n), path_, ": no dataset '", n, "'", exists(n) ? " (it is a group)" : "");
  QuietErrors quiet;
  Hid d(H5Dopen2(id_, n.c_str(), H5P_DEFAULT));
  if (!d.valid()) fail("cannot open dataset '" + n + "'");
  DatasetInfo info;
  Hid type(H5Dget_type(d.get()));
  if (!type.valid()) fail("cannot read the type of dataset '" + n + "'");
  std::string what;
  ZP_REQUIRE(dtype_of_h5(type.get(), &info.dtype, &what), where(), "unsupported element type: ", what);
  Hid space(H5Dget_space(d.get()));
  if (!space.valid()) fail("cannot read the shape of dataset '" + n + "'");
  H5S_class_t cls = H5Sget_simple_extent_type(space.get());
  ZP_REQUIRE(cls == H5S_SIMPLE || cls == H5S_SCALAR, where(), "has a null dataspace");
  const std::vector<hsize_t> dims = space_dims(space.get(), [&](const std::string& why) {
    std::string stack = h5_stack();
    throw Error(where() + "its shape " + why + " (HDF5: " + stack + ")");
  });
  const int nd = int(dims.size());
  ZP_REQUIRE(checked_numel(dims) >= 0, where(), "its shape ", dims_str(dims),
             " has more elements than 64-bit sizes can count (a damaged file?)");
  info.shape.assign(dims.begin(), dims.end());
  Hid dcpl(H5Dget_create_plist(d.get()));
  if (!dcpl.valid()) fail("cannot read the layout of dataset '" + n + "'");
  H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout == H5D_CHUNKED) {
    std::vector<hsize_t> c(size_t(std::max(nd, 1)));
    int cn = H5Pget_chunk(dcpl.get(), int(c.size()), c.data());
    if (cn > 0) info.chunk.assign(c.begin(), c.begin() + cn);
  } else if (layout == H5D_CONTIGUOUS) {
    haddr_t a = H5Dget_offset(d.get());
    if (a != HADDR_UNDEF) info.file_offset = int64_t(a);
  }
  ZP_H5_CHECK(H5Eclear2(H5E_DEFAULT));  // H5Dget_offset of unallocated storage leaves an error on the stack
  return info;
}

void H5File::write_slice(const std::string& path, DType mem_dtype, const void* data, int64_t flat_offset,
                         int64_t count) {
  transfer(true, path, mem_dtype, const_cast<void*>(data), flat_offset, count);
}

void H5File::read_slice(const std::string& path, DType mem_dtype, void* data, int64_t flat_offset,
                        int64_t count) const {
  transfer(false, path, mem_dtype, data, flat_offset, count);
}

void H5File::transfer(bool write, const std::string& path, DType mem_dtype, void* data, int64_t flat_offset,
                      int64_t count) const {
  std::string n = norm_path(path);
  const char* verb = write ? "write" : "read";
  auto where = [&] { return path_ + ": dataset '" + n + "': "; };

  // Validate locally, then agree: a rank that throws before a collective call would hang the rest.
  std::string err;
  DatasetInfo info;
  int64_t piece = 0, pieces = 0;
  try {
    ZP_REQUIRE(is_open(), path_, ": ", verb, " of a closed file");
    info = dataset_info(n);
    ZP_REQUIRE(mem_dtype == info.dtype || (dtype_is_float(mem_dtype) && dtype_is_float(info.dtype)), where(),
               "cannot ", verb, " ", dtype_name(info.dtype), " data as ", dtype_name(mem_dtype));
    ZP_REQUIRE(flat_offset >= 0 && count >= 0 && flat_offset + count <= info.numel(), where(), verb,
               " of elements [", flat_offset, ", ", flat_offset + count, ") outside its ", info.numel(),
               " elements (shape ", shape_str(info.shape), ")");
    // A conversion needs a buffer of one piece, so convert in smaller pieces.
    size_t esize = std::max(dtype_size(mem_dtype), dtype_size(info.dtype));
    size_t max_bytes = mem_dtype == info.dtype ? max_io_bytes_ : std::min<size_t>(max_io_bytes_, 64 << 20);
    piece = std::max<int64_t>(1, int64_t(max_bytes / esize));
    pieces = (count + piece - 1) / piece;
  } catch (const Error& e) {
    err = e.what();
  }
  int64_t agree[2] = {pieces, err.empty() ? 0 : 1};
  if (parallel_) ZP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, agree, 2, MPI_INT64_T, MPI_MAX, comm_));
  if (!err.empty()) throw Error(err);
  if (agree[1]) throw Error(where() + verb + " abandoned: another rank's request was invalid");
  pieces = agree[0];

  QuietErrors quiet;
  Hid d(checked(H5Dopen2(id_, n.c_str(), H5P_DEFAULT), "H5Dopen2"));
  Hid fspace(checked(H5Dget_space(d.get()), "H5Dget_space"));
  Hid ftype = make_type(info.dtype);
  Hid dxpl(checked(H5Pcreate(H5P_DATASET_XFER), "H5Pcreate"));
  if (parallel_) {
    ZP_H5_CHECK(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE));
    // Reads go to MPI-IO as independent reads (still one collective HDF5 call): Open MPI 4.1's
    // ompio returns wrong data from collective reads whose ranges overlap between ranks.
    if (!write) ZP_H5_CHECK(H5Pset_dxpl_mpio_collective_opt(dxpl.get(), H5FD_MPIO_INDIVIDUAL_IO));
  }
  const size_t fsize = dtype_size(info.dtype), msize = dtype_size(mem_dtype);
  std::vector<char> convert;
  static char empty_buffer[8];

  // After a failure a rank keeps joining the remaining collective calls with nothing selected.
  for (int64_t p = 0; p < pieces; ++p) {
    int64_t begin = flat_offset + p * piece;
    int64_t c = err.empty() ? std::clamp<int64_t>(flat_offset + count - begin, 0, piece) : 0;
    Hid mspace;
    if (c == 0) {
      ZP_H5_CHECK(H5Sselect_none(fspace.get()));
      hsize_t one = 1;
      mspace = Hid(checked(H5Screate_simple(1, &one, nullptr), "H5Screate_simple"));
      ZP_H5_CHECK(H5Sselect_none(mspace.get()));
    } else {
      if (info.shape.empty()) {
        ZP_H5_CHECK(H5Sselect_all(fspace.get()));
      } else {
        auto blocks = flat_range_hyperslabs(info.shape, begin, c);
        for (size_t i = 0; i < blocks.size(); ++i) {
          auto start = to_hsize(blocks[i].start), cnt = to_hsize(blocks[i].count);
          ZP_H5_CHECK(H5Sselect_hyperslab(fspace.get(), i == 0 ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(),
                                          nullptr, cnt.data(), nullptr));
        }
      }
      hsize_t mc = hsize_t(c);
      mspace = Hid(checked(H5Screate_simple(1, &mc, nullptr), "H5Screate_simple"));
    }
    char* mem = c == 0 ? empty_buffer : static_cast<char*>(data) + size_t(begin - flat_offset) * msize;
    void* buf = mem;
    if (c > 0 && mem_dtype != info.dtype) {
      convert.resize(size_t(c) * fsize);
      buf = convert.data();
      if (write) kernels::cpu::cast(nullptr, info.dtype, buf, mem_dtype, mem, c);
    }
    // An injected write fault joins the collective call with nothing selected, as a failed rank does.
    const bool injected = write && c > 0 && fault::hit(fault::Site::Write);
    if (injected) {
      ZP_H5_CHECK(H5Sselect_none(fspace.get()));
      ZP_H5_CHECK(H5Sselect_none(mspace.get()));
    }
    herr_t rc = write ? H5Dwrite(d.get(), ftype.get(), mspace.get(), fspace.get(), dxpl.get(), buf)
                      : H5Dread(d.get(), ftype.get(), mspace.get(), fspace.get(), dxpl.get(), buf);
    if ((rc < 0 || injected) && err.empty()) {
      err = where() + verb + " of elements [" + std::to_string(begin) + ", " + std::to_string(begin + c) +
            ") failed (HDF5: " + (injected ? std::string("No space left on device") + fault::kInjected : h5_stack()) +
            ")";
    } else if (rc >= 0 && c > 0 && !write && mem_dtype != info.dtype) {
      kernels::cpu::cast(nullptr, mem_dtype, mem, info.dtype, buf, c);
    }
  }
  err = parallel_ ? first_error(comm_, err) : err;
  if (!err.empty()) throw Error(err);
}

std::string first_error(MPI_Comm comm, const std::string& mine) {
  int size = 1, rank = 0, init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (comm != MPI_COMM_NULL && init && !fin) {
    ZP_MPI_CHECK(MPI_Comm_size(comm, &size));
    ZP_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  }
  if (size <= 1) return mine;
  int first = mine.empty() ? size : rank;
  ZP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm));
  if (first == size) return "";
  int64_t len = int64_t(mine.size());
  ZP_MPI_CHECK(MPI_Bcast(&len, 1, MPI_INT64_T, first, comm));
  std::string msg = mine;
  msg.resize(size_t(len));
  ZP_MPI_CHECK(MPI_Bcast(msg.data(), int(len), MPI_CHAR, first, comm));
  return rank == first ? msg : msg + " [reported by rank " + std::to_string(first) + "]";
}

// --- attributes --------------------------------------------------------------------------------

void H5File::set_attr_raw(const std::string& obj, const std::string& name, int64_t type, int64_t space,
                          const void* data) {
  std::string n = norm_path(obj);
  ZP_REQUIRE(exists(n), path_, ": cannot set attribute '", name, "': no object '", n, "'");
  QuietErrors quiet;
  htri_t has = H5Aexists_by_name(id_, n.c_str(), name.c_str(), H5P_DEFAULT);
  if (has < 0) fail("cannot check attribute '" + name + "' on '" + n + "'");
  if (has > 0 && H5Adelete_by_name(id_, n.c_str(), name.c_str(), H5P_DEFAULT) < 0)
    fail("cannot replace attribute '" + name + "' on '" + n + "'");
  Hid a(H5Acreate_by_name(id_, n.c_str(), name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (!a.valid()) fail("cannot create attribute '" + name + "' on '" + n + "'");
  static const char nothing = 0;  // H5Awrite rejects a null buffer even for an empty attribute
  if (H5Awrite(a.get(), type, data ? data : &nothing) < 0) fail("cannot write attribute '" + name + "' on '" + n + "'");
}

static Hid vl_string_type() {
  Hid t(checked(H5Tcopy(H5T_C_S1), "H5Tcopy"));
  ZP_H5_CHECK(H5Tset_size(t.get(), H5T_VARIABLE));
  ZP_H5_CHECK(H5Tset_cset(t.get(), H5T_CSET_UTF8));
  return t;
}

void H5File::set_attr_string(const std::string& obj, const std::string& name, const std::string& value) {
  Hid t = vl_string_type();
  Hid s = make_space({});
  const char* p = value.c_str();
  set_attr_raw(obj, name, t.get(), s.get(), &p);
}

void H5File::set_attr_int(const std::string& obj, const std::string& name, int64_t value) {
  Hid s = make_space({});
  set_attr_raw(obj, name, H5T_STD_I64LE, s.get(), &value);
}

void H5File::set_attr_double(const std::string& obj, const std::string& name, double value) {
  Hid s = make_space({});
  set_attr_raw(obj, name, H5T_IEEE_F64LE, s.get(), &value);
}

void H5File::set_attr_bytes(const std::string& obj, const std::string& name, const std::vector<uint8_t>& value) {
  Hid s = make_space({int64_t(value.size())});  // zero-sized when empty: h5py reads an empty array
  set_attr_raw(obj, name, H5T_STD_U8LE, s.get(), value.data());
}

void H5File::set_attr_ints(const std::string& obj, const std::string& name, const std::vector<int64_t>& values,
                           const Shape& shape) {
  Shape sh = shape.empty() ? Shape{int64_t(values.size())} : shape;
  ZP_REQUIRE(shape_numel(sh) == int64_t(values.size()), path_, ": attribute '", name, "': ", values.size(),
             " values for shape ", shape_str(sh));
  Hid s = make_space(sh);
  set_attr_raw(obj, name, H5T_STD_I64LE, s.get(), values.data());
}

bool H5File::has_attr(const std::string& obj, const std::string& name) const {
  std::string n = norm_path(obj);
  if (!exists(n)) return false;
  QuietErrors quiet;
  return H5Aexists_by_name(id_, n.c_str(), name.c_str(), H5P_DEFAULT) > 0;
}

std::vector<std::string> H5File::attr_names(const std::string& obj) const {
  std::string n = norm_path(obj);
  ZP_REQUIRE(exists(n), path_, ": no object '", n, "'");
  QuietErrors quiet;
  Hid o(H5Oopen(id_, n.c_str(), H5P_DEFAULT));
  if (!o.valid()) fail("cannot open '" + n + "'");
  std::vector<std::string> names;
  auto collect = [](hid_t, const char* name, const H5A_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  if (H5Aiterate2(o.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect, &names) < 0)
    fail("cannot list the attributes of '" + n + "'");
  std::sort(names.begin(), names.end());
  return names;
}

namespace {
// An open attribute with its type, space and element count, for the readers.
struct OpenAttr {
  Hid attr, type, space;
  H5T_class_t cls = H5T_NO_CLASS;
  H5S_class_t space_cls = H5S_NO_CLASS;
  int64_t npoints = 0;
};
}  // namespace

static OpenAttr open_attr(const H5File& f, hid_t file, const std::string& obj, const std::string& name) {
  std::string n = norm_path(obj);
  ZP_REQUIRE(f.has_attr(n, name), f.path(), ": no attribute '", name, "' on '", n, "'");
  QuietErrors quiet;
  auto fail = [&](const std::string& why) {
    std::string stack = h5_stack();
    throw Error(f.path() + ": attribute '" + name + "' on '" + n + "': " + why + " (HDF5: " + stack + ")");
  };
  OpenAttr a;
  a.attr = Hid(H5Aopen_by_name(file, n.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT));
  if (!a.attr.valid()) fail("cannot open it");
  // A damaged attribute message fails here, so these are input errors, not broken invariants.
  a.type = Hid(H5Aget_type(a.attr.get()));
  if (!a.type.valid()) fail("cannot read its type");
  a.space = Hid(H5Aget_space(a.attr.get()));
  if (!a.space.valid()) fail("cannot read its shape");
  a.cls = H5Tget_class(a.type.get());
  a.space_cls = H5Sget_simple_extent_type(a.space.get());
  if (a.space_cls == H5S_NULL) return a;
  const std::vector<hsize_t> dims = space_dims(a.space.get(), [&](const std::string& why) { fail("its shape " + why); });
  a.npoints = checked_numel(dims);
  if (a.npoints < 0) fail("its shape " + dims_str(dims) + " has more elements than 64-bit sizes can count");
  // The readers size their buffers by the element count: it must agree with what the file stores.
  const size_t type_size = H5Tget_size(a.type.get());
  if (type_size == 0) fail("cannot read the size of its type");
  if (a.cls != H5T_STRING || H5Tis_variable_str(a.type.get()) <= 0) {
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(uint64_t(a.npoints), uint64_t(type_size), &bytes) ||
        bytes > uint64_t(H5Aget_storage_size(a.attr.get())))
      fail(std::to_string(a.npoints) + " elements of " + std::to_string(type_size) + " bytes but " +
           std::to_string(H5Aget_storage_size(a.attr.get())) + " bytes stored");
  }
  return a;
}

AttrKind H5File::attr_kind(const std::string& obj, const std::string& name) const {
  OpenAttr a = open_attr(*this, id_, obj, name);
  bool scalar = a.space_cls == H5S_SCALAR;
  if (a.cls == H5T_STRING) return scalar ? AttrKind::String : AttrKind::Other;
  if (a.cls == H5T_INTEGER) {
    if (H5Tget_size(a.type.get()) == 1 && H5Tget_sign(a.type.get()) == H5T_SGN_NONE) return AttrKind::Bytes;
    return scalar ? AttrKind::Int64 : AttrKind::Int64Array;
  }
  if (a.cls == H5T_FLOAT && scalar) return AttrKind::Double;
  return AttrKind::Other;
}

Shape H5File::attr_shape(const std::string& obj, const std::string& name) const {
  OpenAttr a = open_attr(*this, id_, obj, name);
  if (a.space_cls == H5S_NULL) return {0};
  // open_attr has checked the dimensions (each fits int64).
  const std::vector<hsize_t> dims = space_dims(a.space.get(), [&](const std::string& why) {
    fail("attribute '" + name + "' on '" + norm_path(obj) + "': its shape " + why);
  });
  return Shape(dims.begin(), dims.end());
}

std::string H5File::attr_string(const std::string& obj, const std::string& name) const {
  OpenAttr a = open_attr(*this, id_, obj, name);
  auto where = [&] { return path_ + ": attribute '" + name + "' on '" + norm_path(obj) + "': "; };
  ZP_REQUIRE(a.cls == H5T_STRING && a.npoints == 1, where(), "not a string");
  QuietErrors quiet;
  if (H5Tis_variable_str(a.type.get()) > 0) {
    Hid mt = vl_string_type();
    char* p = nullptr;
    if (H5Aread(a.attr.get(), mt.get(), &p) < 0) fail("cannot read attribute '" + name + "'");
    std::string s = p ? p : "";
    if (p) ZP_H5_CHECK(H5free_memory(p));
    return s;
  }
  size_t size = H5Tget_size(a.type.get());
  Hid mt(checked(H5Tcopy(H5T_C_S1), "H5Tcopy"));
  ZP_H5_CHECK(H5Tset_size(mt.get(), size + 1));  // room for the terminator HDF5 adds
  std::string s(size + 1, '\0');
  if (H5Aread(a.attr.get(), mt.get(), s.data()) < 0) fail("cannot read attribute '" + name + "'");
  s.resize(std::strlen(s.c_str()));
  return s;
}

int64_t H5File::attr_int(const std::string& obj, const std::string& name) const {
  OpenAttr a = open_attr(*this, id_, obj, name);
  ZP_REQUIRE(a.cls == H5T_INTEGER && a.npoints == 1, path_, ": attribute '", name, "' on '", norm_path(obj),
             "': not a single integer");
  QuietErrors quiet;
  int64_t v = 0;
  if (H5Aread(a.attr.get(), H5T_NATIVE_INT64, &v) < 0) fail("cannot read attribute '" + name + "'");
  return v;
}

double H5File::attr_double(const std::string& obj, const std::string& name) const {
  OpenAttr a = open_attr(*this, id_, obj, name);
  ZP_REQUIRE((a.cls == H5T_FLOAT || a.cls == H5T_INTEGER) && a.npoints == 1, path_, ": attribute '", name,
             "' on '", norm_path(obj), "': not a single number");
  QuietErrors quiet;
  double v = 0;
  if (H5Aread(a.attr.get(), H5T_NATIVE_DOUBLE, &v) < 0) fail("cannot read attribute '" + name + "'");
  return v;
}

std::vector<uint8_t> H5File::attr_bytes(const std::string& obj, const std::string& name) const {
  OpenAttr a = open_attr(*this, id_, obj, name);
  ZP_REQUIRE(a.cls == H5T_INTEGER && H5Tget_size(a.type.get()) == 1, path_, ": attribute '", name, "' on '",
             norm_path(obj), "': not a byte array");
  std::vector<uint8_t> v(size_t(a.npoints));
  if (v.empty()) return v;
  QuietErrors quiet;
  if (H5Aread(a.attr.get(), H5T_NATIVE_UINT8, v.data()) < 0) fail("cannot read attribute '" + name + "'");
  return v;
}

std::vector<int64_t> H5File::attr_ints(const std::string& obj, const std::string& name) const {
  OpenAttr a = open_attr(*this, id_, obj, name);
  ZP_REQUIRE(a.cls == H5T_INTEGER, path_, ": attribute '", name, "' on '", norm_path(obj),
             "': not an integer array");
  std::vector<int64_t> v(size_t(a.npoints));
  if (v.empty()) return v;
  QuietErrors quiet;
  if (H5Aread(a.attr.get(), H5T_NATIVE_INT64, v.data()) < 0) fail("cannot read attribute '" + name + "'");
  return v;
}

}  // namespace zp::io
