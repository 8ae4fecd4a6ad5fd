// Single-process tests of the HDF5 layer: the flat-range -> hyperslab mapping (exhaustively for
// small shapes), dtypes and attributes round trips, errors on bad user files, the atomic save and
// checkpoint rotation. Collective behaviour is in tests/mpi/test_checkpoint_file.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "io/checkpoint_file.h"
#include "io/h5file.h"
#include "test_util.h"

namespace zp::test {
namespace {
using namespace zp::io;
namespace fs = std::filesystem;

// A fresh directory per test (several test binaries may run at once).
class TmpDir {
 public:
  explicit TmpDir(const std::string& name)
      : dir_(fs::temp_directory_path() / ("zp_h5_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~TmpDir() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string operator/(const std::string& f) const { return (dir_ / f).string(); }
  std::string str() const { return dir_.string(); }

 private:
  fs::path dir_;
};

int64_t flat_index(const Shape& shape, const std::vector<int64_t>& idx) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + idx[d];
  return f;
}

// The mapping's contract, checked for one range: blocks in flat order, each a contiguous flat range
// inside the array, together tiling exactly [offset, offset+count).
void check_blocks(const Shape& shape, int64_t offset, int64_t count) {
  auto blocks = flat_range_hyperslabs(shape, offset, count);
  SCOPED_TRACE(shape_str(shape) + " offset " + std::to_string(offset) + " count " + std::to_string(count));
  if (count == 0) { EXPECT_TRUE(blocks.empty()); return; }
  EXPECT_LE(blocks.size(), 2 * shape.size() - 1);
  int64_t next = offset;
  for (const auto& b : blocks) {
    ASSERT_EQ(b.start.size(), shape.size());
    ASSERT_EQ(b.count.size(), shape.size());
    int64_t n = 1;
    for (size_t d = 0; d < shape.size(); ++d) {
      EXPECT_GE(b.start[d], 0);
      EXPECT_GE(b.count[d], 1);
      EXPECT_LE(b.start[d] + b.count[d], shape[d]);
      n *= b.count[d];
    }
    // Contiguous: after the first dimension with count > 1, every dimension is whole.
    size_t d = 0;
    while (d < shape.size() && b.count[d] == 1) ++d;
    for (size_t e = d + 1; e < shape.size(); ++e) EXPECT_TRUE(b.start[e] == 0 && b.count[e] == shape[e]);
    EXPECT_EQ(flat_index(shape, b.start), next);
    next += n;
  }
  EXPECT_EQ(next, offset + count);
}

TEST(H5Hyperslab, ExhaustiveSmallShapes) {
  for (const Shape& s : {Shape{7}, Shape{3, 5}, Shape{2, 3, 4}, Shape{1, 1, 6}, Shape{4, 1, 3}, Shape{2, 2, 2, 3}}) {
    int64_t n = shape_numel(s);
    for (int64_t off = 0; off <= n; ++off)
      for (int64_t cnt = 0; off + cnt <= n; ++cnt) check_blocks(s, off, cnt);
  }
}

TEST(H5Hyperslab, KnownDecomposition) {
  // [3,5], elements 3..11: the tail of row 0, all of row 1, the head of row 2.
  auto b = flat_range_hyperslabs({3, 5}, 3, 9);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0], (HyperslabBlock{{0, 3}, {1, 2}}));
  EXPECT_EQ(b[1], (HyperslabBlock{{1, 0}, {1, 5}}));
  EXPECT_EQ(b[2], (HyperslabBlock{{2, 0}, {1, 2}}));
  // [3,3,4], elements 5..30: the tail of plane 0 (row 1 from element 1, row 2), plane 1 whole,
  // the head of plane 2 (row 0, then 3 elements of row 1): 2*ndim-1 = 5 blocks.
  EXPECT_EQ(flat_range_hyperslabs({3, 3, 4}, 5, 26),
            (std::vector<HyperslabBlock>{{{0, 1, 1}, {1, 1, 3}}, {{0, 2, 0}, {1, 1, 4}}, {{1, 0, 0}, {1, 3, 4}},
                                         {{2, 0, 0}, {1, 1, 4}}, {{2, 1, 0}, {1, 1, 3}}}));
  EXPECT_EQ(flat_range_hyperslabs({3, 3, 4}, 5, 27).size(), 4u);  // ends on a row boundary
  EXPECT_EQ(flat_range_hyperslabs({2, 3, 4}, 0, 24), (std::vector<HyperslabBlock>{{{0, 0, 0}, {2, 3, 4}}}));
  EXPECT_EQ(flat_range_hyperslabs({}, 0, 1).size(), 1u);  // scalar
  EXPECT_THROW(flat_range_hyperslabs({3, 5}, 10, 6), Error);
  EXPECT_THROW(flat_range_hyperslabs({3, 5}, -1, 2), Error);
}

// Reading every (offset, count) range through HDF5 returns exactly those elements.
TEST(H5File, ReadEveryFlatRange) {
  TmpDir dir("ranges");
  std::string p = dir / "r.h5";
  const std::vector<Shape> shapes = {{7}, {3, 5}, {2, 3, 4}};
  {
    H5File f = H5File::create(p);
    for (size_t i = 0; i < shapes.size(); ++i) {
      std::vector<int32_t> v(size_t(shape_numel(shapes[i])));
      std::iota(v.begin(), v.end(), 0);
      std::string name = "/d" + std::to_string(i);
      f.create_dataset(name, DType::I32, shapes[i], i == 2 ? Shape{1, 2, 3} : Shape{});
      // Written in three uneven pieces, as three ranks would.
      int64_t n = int64_t(v.size()), a = n / 3, b = n - 2;
      f.write_slice(name, DType::I32, v.data(), 0, a);
      f.write_slice(name, DType::I32, v.data() + a, a, b - a);
      f.write_slice(name, DType::I32, v.data() + b, b, n - b);
    }
  }
  H5File f = H5File::open(p);
  for (size_t i = 0; i < shapes.size(); ++i) {
    std::string name = "/d" + std::to_string(i);
    EXPECT_EQ(f.dataset_info(name).shape, shapes[i]);
    int64_t n = shape_numel(shapes[i]);
    for (int64_t off = 0; off <= n; ++off) {
      for (int64_t cnt = 0; off + cnt <= n; ++cnt) {
        std::vector<int32_t> got(size_t(cnt) + 1, -1);
        f.read_slice(name, DType::I32, got.data(), off, cnt);
        for (int64_t k = 0; k < cnt; ++k) ASSERT_EQ(got[size_t(k)], off + k) << name << " [" << off << "+" << cnt << ")";
        ASSERT_EQ(got[size_t(cnt)], -1) << "read past the range";
      }
    }
  }
}

TEST(H5File, EveryDtypeRoundTrip) {
  TmpDir dir("dtypes");
  std::string p = dir / "t.h5";
  auto vals = randn(3 * 7, 11, 3.f);
  const Shape shape = {3, 7};
  std::vector<DType> all = {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8};
  auto host = [&](DType dt) {
    std::vector<float> v = vals;
    if (!dtype_is_float(dt)) for (auto& x : v) x = std::round(std::fabs(x) * 20);
    return upload(v, dt, Device::cpu());
  };
  {
    H5File f = H5File::create(p);
    for (DType dt : all) {
      std::string name = "/g/" + std::string(dtype_name(dt));
      f.create_dataset(name, dt, shape);
      Tensor t = host(dt);
      f.write_slice(name, dt, t.data(), 0, 10);
      f.write_slice(name, dt, static_cast<char*>(t.data()) + 10 * dtype_size(dt), 10, 11);
    }
  }
  H5File f = H5File::open(p);
  EXPECT_EQ(f.children("/g").size(), all.size());
  for (DType dt : all) {
    std::string name = "/g/" + std::string(dtype_name(dt));
    DatasetInfo info = f.dataset_info(name);
    EXPECT_EQ(info.dtype, dt) << name;
    EXPECT_EQ(info.shape, shape);
    Tensor want = host(dt), got = Tensor::empty({21}, dt, Device::cpu());
    f.read_slice(name, dt, got.data(), 0, 21);
    EXPECT_EQ(std::memcmp(want.data(), got.data(), want.nbytes()), 0) << name << " not bitwise equal";
  }
}

TEST(H5File, Bf16BitwiseAndConversion) {
  TmpDir dir("bf16");
  std::string p = dir / "b.h5";
  // Every bf16 bit pattern except NaNs (HDF5's conversion may canonicalise those).
  std::vector<bf16> all;
  for (uint32_t b = 0; b < 65536; ++b)
    if ((b & 0x7f80u) != 0x7f80u || (b & 0x7fu) == 0) all.push_back(bf16::from_bits(uint16_t(b)));
  int64_t n = int64_t(all.size());
  {
    H5File f = H5File::create(p);
    f.create_dataset("w", DType::BF16, {n});
    f.write_slice("w", DType::BF16, all.data(), 0, n);
    // Written from f32 master weights: rounded to nearest even like zp::bf16.
    auto v = randn(100, 5);
    f.create_dataset("from_f32", DType::BF16, {10, 10});
    f.write_slice("from_f32", DType::F32, v.data(), 0, 100);
    f.create_dataset("h", DType::F16, {100});
    f.write_slice("h", DType::F32, v.data(), 0, 100);
  }
  H5File f = H5File::open(p);
  std::vector<bf16> back(static_cast<size_t>(n));
  f.read_slice("w", DType::BF16, back.data(), 0, n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(back[size_t(i)].bits, all[size_t(i)].bits) << i;
  // Widening to f32 is exact.
  std::vector<float> wide(static_cast<size_t>(n));
  f.read_slice("w", DType::F32, wide.data(), 0, n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(float_bits(wide[size_t(i)]), float_bits(float(all[size_t(i)]))) << i;
  auto v = randn(100, 5);
  std::vector<float> got(100);
  f.read_slice("from_f32", DType::F32, got.data(), 0, 100);
  EXPECT_EQ(got, round_to(v, DType::BF16));
  f.read_slice("h", DType::F32, got.data(), 0, 100);
  EXPECT_EQ(got, round_to(v, DType::F16));
  std::vector<int32_t> ints(4);
  expect_error([&] { f.read_slice("h", DType::I32, ints.data(), 0, 4); }, {p, "/h", "cannot read f16 data as i32"});
}

TEST(H5File, SplitsLargeTransfers) {
  TmpDir dir("pieces");
  std::string p = dir / "p.h5";
  auto v = randn(1000, 3);
  H5File f = H5File::create(p);
  f.set_max_io_bytes(64);  // 16 f32 per H5Dwrite, 8 per piece when converting
  f.create_dataset("a", DType::F32, {10, 100});
  f.write_slice("a", DType::F32, v.data(), 0, 1000);
  f.create_dataset("b", DType::BF16, {1000});
  f.write_slice("b", DType::F32, v.data(), 0, 1000);
  std::vector<float> got(997);
  f.read_slice("a", DType::F32, got.data(), 3, 997);
  EXPECT_EQ(got, std::vector<float>(v.begin() + 3, v.end()));
  f.read_slice("b", DType::F32, got.data(), 3, 997);
  auto r = round_to(v, DType::BF16);
  EXPECT_EQ(got, std::vector<float>(r.begin() + 3, r.end()));
}

TEST(H5File, AttributesRoundTrip) {
  TmpDir dir("attrs");
  std::string p = dir / "a.h5";
  std::string json = R"({"model": {"n_layer": 12}, "note": "ünïcode"})";
  std::string big(200000, 'x');  // beyond the 64 KiB compact attribute limit
  std::vector<uint8_t> rng(5000);
  for (size_t i = 0; i < rng.size(); ++i) rng[i] = uint8_t(i * 37 + 1);
  {
    H5File f = H5File::create(p);
    f.create_dataset("/model/w", DType::F32, {2, 2});
    f.set_attr_string("/", "config", json);
    f.set_attr_string("/", "big", big);
    f.set_attr_int("/", "step", 1234567890123);
    f.set_attr_double("/model", "lr", 3e-4);
    f.set_attr_bytes("/model/w", "rng", rng);
    f.set_attr_bytes("/", "empty", {});
    f.set_attr_ints("/model/w", "pairs", {1, 2, 3, 4, 5, 6}, {3, 2});
    f.set_attr_int("/", "step", 7);  // replaces
  }
  H5File f = H5File::open(p);
  EXPECT_EQ(f.attr_string("/", "config"), json);
  EXPECT_EQ(f.attr_string("/", "big"), big);
  EXPECT_EQ(f.attr_int("/", "step"), 7);
  EXPECT_EQ(f.attr_double("/model", "lr"), 3e-4);
  EXPECT_EQ(f.attr_bytes("/model/w", "rng"), rng);
  EXPECT_TRUE(f.attr_bytes("/", "empty").empty());
  EXPECT_EQ(f.attr_ints("/model/w", "pairs"), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(f.attr_shape("/model/w", "pairs"), (Shape{3, 2}));
  EXPECT_EQ(f.attr_kind("/", "config"), AttrKind::String);
  EXPECT_EQ(f.attr_kind("/", "step"), AttrKind::Int64);
  EXPECT_EQ(f.attr_kind("/model", "lr"), AttrKind::Double);
  EXPECT_EQ(f.attr_kind("/model/w", "rng"), AttrKind::Bytes);
  EXPECT_EQ(f.attr_kind("/model/w", "pairs"), AttrKind::Int64Array);
  EXPECT_EQ(f.attr_names("/"), (std::vector<std::string>{"big", "config", "empty", "step"}));
  EXPECT_TRUE(f.has_attr("model/w", "rng"));
  EXPECT_FALSE(f.has_attr("/model/w", "nope"));
  EXPECT_FALSE(f.has_attr("/missing", "rng"));
  expect_error([&] { f.attr_int("/", "config"); }, {p, "config", "not a single integer"});
  expect_error([&] { f.attr_string("/model", "nope"); }, {p, "nope", "/model"});
  EXPECT_TRUE(f.is_group("/model"));
  EXPECT_TRUE(f.is_dataset("/model/w"));
  EXPECT_FALSE(f.exists("/model/w/x"));
  EXPECT_FALSE(f.exists("/nope/w"));
}

TEST(H5File, ErrorsNameFileAndDataset) {
  TmpDir dir("errors");
  // Missing file.
  expect_error([&] { H5File::open(dir / "missing.h5"); }, {dir / "missing.h5", "no such file"});
  // Not HDF5.
  std::string garbage = dir / "garbage.h5";
  std::ofstream(garbage) << std::string(4096, 'g');
  expect_error([&] { H5File::open(garbage); }, {garbage, "not an HDF5 file"});
  expect_error([&] { CheckpointReader r(garbage); }, {garbage, "not an HDF5 file"});
  // A real file, then cut in half.
  std::string good = dir / "good.h5";
  {
    CheckpointWriter w(good);
    std::vector<float> v(4096, 1.f);
    w.write("/model/w", DType::F32, {64, 64}, DType::F32, v.data(), 0, 4096);
    w.commit();
  }
  std::string cut = dir / "cut.h5";
  fs::copy_file(good, cut);
  fs::resize_file(cut, fs::file_size(cut) / 2);
  expect_error([&] { CheckpointReader r(cut); }, {cut, "damaged or truncated"});
  // Missing dataset, wrong shape, wrong dtype, out of range.
  CheckpointReader r(good);
  std::vector<float> buf(4096);
  expect_error([&] { r.read("/model/nope", {64, 64}, DType::F32, buf.data(), 0, 1); }, {good, "/model/nope", "no dataset"});
  expect_error([&] { r.read("/model/w", {64, 65}, DType::F32, buf.data(), 0, 1); }, {good, "/model/w", "[64, 64]", "[64, 65]"});
  expect_error([&] { r.read("/model", {64, 64}, DType::F32, buf.data(), 0, 1); }, {good, "/model", "group"});
  std::vector<int64_t> ints(4);
  expect_error([&] { r.read("/model/w", {64, 64}, DType::I64, ints.data(), 0, 4); }, {good, "/model/w", "i64"});
  expect_error([&] { r.read("/model/w", {64, 64}, DType::F32, buf.data(), 4000, 100); }, {good, "/model/w", "outside"});
  // A valid HDF5 file that is not a checkpoint.
  std::string plain = dir / "plain.h5";
  H5File::create(plain).close();
  expect_error([&] { CheckpointReader r2(plain); }, {plain, "zeropipe_format"});
  // Creating twice, bad chunking.
  H5File f = H5File::create(dir / "c.h5");
  f.create_dataset("x", DType::F32, {4});
  expect_error([&] { f.create_dataset("x", DType::F32, {4}); }, {dir / "c.h5", "/x", "already exists"});
  expect_error([&] { f.create_dataset("y", DType::F32, {4, 4}, {8, 1}); }, {dir / "c.h5", "/y", "chunk"});
}

// Writes a one-dataset checkpoint whose values are all `v`.
void write_checkpoint(const std::string& path, float v) {
  CheckpointWriter w(path);
  std::vector<float> x(1000, v);
  w.file().set_attr_int("/", "step", int64_t(v));
  w.write("/model/w", DType::F32, {10, 100}, DType::F32, x.data(), 0, 1000);
  w.commit();
}

float first_value(const std::string& path) {
  CheckpointReader r(path);
  float x = 0;
  r.read("/model/w", {10, 100}, DType::F32, &x, 0, 1);
  return x;
}

TEST(Checkpoint, AtomicSaveKeepsPreviousOnFailure) {
  TmpDir dir("atomic");
  std::string p = dir / "ckpt.h5";
  write_checkpoint(p, 1.f);
  EXPECT_EQ(first_value(p), 1.f);
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  // A write with a bad range throws midway through the save.
  {
    std::vector<float> x(1000, 2.f);
    CheckpointWriter w(p);
    w.write("/model/w", DType::F32, {10, 100}, DType::F32, x.data(), 0, 500);
    EXPECT_TRUE(fs::exists(p + ".tmp"));
    expect_error([&] { w.write("/model/b", DType::F32, {10}, DType::F32, x.data(), 5, 10); }, {p + ".tmp", "/model/b", "outside"});
    EXPECT_FALSE(fs::exists(p + ".tmp")) << "a failed save must remove its temporary file";
    expect_error([&] { w.commit(); }, {p, "abandoned"});
  }
  // A save abandoned by an exception in the caller (the writer is destroyed uncommitted).
  try {
    CheckpointWriter w(p);
    throw std::runtime_error("caller failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  EXPECT_EQ(first_value(p), 1.f);
  // The final rename fails (a directory is in the way): the error names the file, nothing is left.
  {
    std::string blocked = dir / "blocked.h5";
    fs::create_directories(blocked + "/keep");
    expect_error([&] { write_checkpoint(blocked, 3.f); }, {blocked, "cannot rename"});
    EXPECT_FALSE(fs::exists(blocked + ".tmp"));
    EXPECT_TRUE(fs::is_directory(blocked + "/keep"));
  }
  // (A full disk was checked by hand on a 256 KiB tmpfs: the write fails with ENOSPC, the
  // temporary file goes, the previous checkpoint stays, and the next save succeeds. RLIMIT_FSIZE
  // cannot stand in for it: HDF5 1.10 crashes at exit after the close of an over-limit file fails.)
  // And a later save succeeds and replaces it.
  write_checkpoint(p, 4.f);
  EXPECT_EQ(first_value(p), 4.f);
  EXPECT_TRUE(verify_checksums(p).ok());
}

TEST(Checkpoint, Crc32MatchesZlib) {
  const char* s = "123456789";
  EXPECT_EQ(crc32(s, 9), 0xCBF43926u);
  EXPECT_EQ(crc32(s + 4, 5, crc32(s, 4)), 0xCBF43926u);
  EXPECT_EQ(crc32(nullptr, 0), 0u);
  std::vector<uint8_t> big(1000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = uint8_t(i * 7);
  uint32_t whole = crc32(big.data(), big.size());
  EXPECT_EQ(crc32(big.data() + 333, 667, crc32(big.data(), 333)), whole);
}

TEST(Checkpoint, ChecksumsAndInspect) {
  TmpDir dir("inspect");
  std::string p = dir / "c.h5";
  auto v = randn(60, 9);
  {
    CheckpointWriter w(p);
    w.file().set_attr_string("/", "config", "{\n  \"n_layer\": 2\n}");
    w.file().set_attr_int("/", "step", 42);
    w.write("/model/w", DType::BF16, {4, 15}, DType::F32, v.data(), 0, 25);
    w.write("/model/w", DType::BF16, {4, 15}, DType::F32, v.data() + 25, 25, 35);
    w.write("/optimizer/w/exp_avg", DType::F32, {4, 15}, DType::F32, v.data(), 0, 60);
    w.write("/gap", DType::F32, {10}, DType::F32, v.data(), 0, 4);  // elements 4..9 never written
    w.commit();
  }
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  {
    H5File f = H5File::open(p);
    EXPECT_EQ(f.attr_int("/", "zeropipe_format"), 1);
    auto rows = f.attr_ints("/model/w", "slice_checksums");
    ASSERT_EQ(rows.size(), 6u);
    EXPECT_EQ(rows[0], 0);
    EXPECT_EQ(rows[1], 25);
    EXPECT_EQ(rows[3], 25);
    EXPECT_EQ(rows[4], 35);
    std::vector<bf16> w16(25);
    for (int i = 0; i < 25; ++i) w16[size_t(i)] = bf16(v[size_t(i)]);
    EXPECT_EQ(uint32_t(rows[2]), crc32(w16.data(), 50));
  }
  ChecksumReport rep = verify_checksums(p);
  EXPECT_EQ(rep.datasets, 3);
  EXPECT_EQ(rep.slices, 4);
  ASSERT_EQ(rep.problems.size(), 1u);
  EXPECT_NE(rep.problems[0].find("/gap: elements [4, 10) were never written"), std::string::npos) << rep.problems[0];
  std::string text = inspect(p, true);
  for (const char* frag : {"ZeRO-Pipe format 1", "/model/w  bf16[4, 15]  2 checksummed slices", "@step = 42",
                           "\"n_layer\": 2", "/optimizer/w/exp_avg  f32[4, 15]", "checksums: FAILED (3 datasets, 4 slices)"})
    EXPECT_NE(text.find(frag), std::string::npos) << "'" << frag << "' not in:\n" << text;

  // Flip one stored byte: verification names the dataset and the slice.
  int64_t off = H5File::open(p).dataset_info("/optimizer/w/exp_avg").file_offset;
  ASSERT_GT(off, 0);
  {
    std::fstream io(p, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(off + 4 * 17);
    char c = 0;
    io.read(&c, 1);
    c ^= 0x10;
    io.seekp(off + 4 * 17);
    io.write(&c, 1);
  }
  rep = verify_checksums(p);
  ASSERT_EQ(rep.problems.size(), 2u);
  EXPECT_NE(rep.problems[1].find("/optimizer/w/exp_avg: elements [0, 60): crc32"), std::string::npos) << rep.problems[1];
}

TEST(Checkpoint, Rotation) {
  TmpDir dir("rotation");
  EXPECT_EQ(checkpoint_filename(123), "step-00000123.h5");
  EXPECT_EQ(checkpoint_filename(1234567890, "run-"), "run-1234567890.h5");
  EXPECT_FALSE(latest_checkpoint(dir.str()).has_value());
  EXPECT_FALSE(latest_checkpoint(dir / "missing").has_value());
  for (int64_t step : {5, 100, 20, 7, 100000000}) write_checkpoint(dir / checkpoint_filename(step), float(step));
  // Neither a temporary file nor an unrelated name counts.
  std::ofstream(dir / "step-00999999.h5.tmp") << "partial";
  std::ofstream(dir / "step-abc.h5") << "x";
  std::ofstream(dir / "other-00000001.h5") << "x";
  auto all = list_checkpoints(dir.str());
  ASSERT_EQ(all.size(), 5u);
  EXPECT_EQ(all.front().step, 5);
  EXPECT_EQ(all.back().step, 100000000);
  EXPECT_EQ(*latest_checkpoint(dir.str()), dir / "step-100000000.h5");
  auto deleted = keep_last_checkpoints(dir.str(), "step-", 2);
  EXPECT_EQ(deleted, (std::vector<std::string>{dir / "step-00000005.h5", dir / "step-00000007.h5", dir / "step-00000020.h5"}));
  all = list_checkpoints(dir.str());
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].step, 100);
  EXPECT_TRUE(fs::exists(dir / "step-00999999.h5.tmp"));
  EXPECT_EQ(first_value(*latest_checkpoint(dir.str())), 100000000.f);
  EXPECT_THROW(keep_last_checkpoints(dir.str(), "step-", 0), Error);
}

}  // namespace
}  // namespace zp::test
