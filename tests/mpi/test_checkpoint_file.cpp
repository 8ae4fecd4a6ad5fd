// Collective checkpoint tests, run under mpirun at several world sizes (1, 2, 3, 5). Every rank
// writes its contiguous 1/N flat slice of datasets with odd sizes (slices cross rows; with 5 ranks
// some own nothing), then reads back ranges that another world size would own, and random ranges
// that differ per rank. Checksums verify collectively and catch a flipped byte; a failure on one
// rank makes every rank throw and keeps the previous checkpoint; h5py reads what we wrote.
//
// A test must never leave a rank out of a collective: checks before collectives use EXPECT (which
// does not return early), and every rank takes the same branches.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "mpi_test_util.h"
#include "io/checkpoint_file.h"
#include "io/h5file.h"

namespace zp::io {
namespace {
using test::SharedDir;
using test::world_rank;
using test::world_size;
namespace fs = std::filesystem;

// Element i of dataset `id`: multiples of 1/4 below 32 in magnitude, exact in f32, bf16 and f16.
float value(int id, int64_t i) { return float(((i * 37 + id * 11) % 251) - 125) * 0.25f; }

struct Spec {
  std::string name;
  DType file_dtype, mem_dtype;  // what is stored, what the writer hands over
  Shape shape;
};
const std::vector<Spec> kSpecs = {
    {"/model/a", DType::F32, DType::F32, {7, 13}},
    {"/model/b", DType::BF16, DType::F32, {3, 5, 7}},  // converted on write
    {"/model/c", DType::F16, DType::F16, {2, 3, 4}},
    {"/model/tiny", DType::F32, DType::F32, {3}},  // with 5 ranks, two own nothing
    {"/model/empty", DType::F32, DType::F32, {0, 4}},
    {"/optimizer/a/exp_avg", DType::F32, DType::F32, {1001}},
    {"/optimizer/a/exp_avg_sq", DType::BF16, DType::BF16, {11, 17}},
};

// The ZeRO shard [begin, end) of rank r of `world` over n elements: ceil(n / world) each, the last
// ones short or empty.
std::pair<int64_t, int64_t> shard(int64_t n, int r, int world) {
  int64_t per = (n + world - 1) / world;
  int64_t b = std::min(n, per * r), e = std::min(n, b + per);
  return {b, e};
}

// `count` elements of dataset `id` from `offset`, as `dt` bytes.
std::vector<char> make_values(int id, DType dt, int64_t offset, int64_t count) {
  std::vector<char> out(size_t(count) * dtype_size(dt) + 1);
  for (int64_t i = 0; i < count; ++i) {
    float v = value(id, offset + i);
    char* p = out.data() + size_t(i) * dtype_size(dt);
    switch (dt) {
      case DType::F32: std::memcpy(p, &v, 4); break;
      case DType::BF16: { bf16 h(v); std::memcpy(p, &h, 2); break; }
      case DType::F16: { f16 h(v); std::memcpy(p, &h, 2); break; }
      default: ADD_FAILURE() << "dtype " << dtype_name(dt);
    }
  }
  return out;
}

void write_checkpoint(const std::string& path) {
  int r = world_rank(), world = world_size();
  CheckpointWriter w(path, MPI_COMM_WORLD);
  w.file().set_attr_int("/", "step", 123);
  w.file().set_attr_string("/", "config", R"({"zero_optimization": {"stage": 3}})");
  for (size_t id = 0; id < kSpecs.size(); ++id) {
    const Spec& s = kSpecs[id];
    auto [b, e] = shard(shape_numel(s.shape), r, world);
    auto v = make_values(int(id), s.mem_dtype, b, e - b);
    w.write(s.name, s.file_dtype, s.shape, s.mem_dtype, v.data(), b, e - b);
  }
  w.commit();
}

// Reads [offset, offset+count) of dataset `id` as f32 and counts wrong elements (collective).
int64_t read_and_check(const CheckpointReader& r, int id, int64_t offset, int64_t count) {
  const Spec& s = kSpecs[size_t(id)];
  std::vector<float> got(size_t(count) + 1, NAN);
  r.read(s.name, s.shape, DType::F32, got.data(), offset, count);
  int64_t bad = 0;
  for (int64_t i = 0; i < count; ++i)
    if (got[size_t(i)] != value(id, offset + i)) {
      if (bad++ == 0)
        ADD_FAILURE() << s.name << " element " << offset + i << ": got " << got[size_t(i)] << ", want "
                      << value(id, offset + i) << " (rank " << world_rank() << ")";
    }
  return bad;
}

TEST(CheckpointMpi, WriteShardsReadAnyRanges) {
  SharedDir dir("h5mpi_shards");
  std::string path = dir / "step-00000123.h5";
  write_checkpoint(path);
  EXPECT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(latest_checkpoint(dir.str()).value_or(""), path);

  CheckpointReader reader(path, MPI_COMM_WORLD);
  EXPECT_EQ(reader.file().attr_int("/", "step"), 123);
  EXPECT_EQ(reader.file().attr_string("/", "config"), R"({"zero_optimization": {"stage": 3}})");
  int r = world_rank(), world = world_size();
  std::mt19937_64 rng(1000 + uint64_t(r));
  for (size_t id = 0; id < kSpecs.size(); ++id) {
    const Spec& s = kSpecs[id];
    int64_t n = shape_numel(s.shape);
    EXPECT_EQ(reader.info(s.name).dtype, s.file_dtype);
    // The shards of other world sizes, spread over this world's ranks round by round.
    for (int other : {1, 2, 3, 4, 7}) {
      for (int round = 0; round * world < other; ++round) {
        int k = round * world + r;
        auto [b, e] = k < other ? shard(n, k, other) : std::pair<int64_t, int64_t>{0, 0};
        EXPECT_EQ(read_and_check(reader, int(id), b, e - b), 0) << s.name << " shard " << k << "/" << other;
      }
    }
    // Arbitrary ranges, different on every rank (some empty).
    for (int t = 0; t < 4; ++t) {
      int64_t off = n ? int64_t(rng() % uint64_t(n + 1)) : 0;
      int64_t cnt = n - off ? int64_t(rng() % uint64_t(n - off + 1)) : 0;
      EXPECT_EQ(read_and_check(reader, int(id), off, cnt), 0) << s.name << " [" << off << ", " << off + cnt << ")";
    }
  }
  // bf16 read back as bf16 is the writer's rounding, bit for bit.
  {
    const Spec& s = kSpecs[6];
    auto [b, e] = shard(shape_numel(s.shape), (r + 1) % world, world);
    std::vector<bf16> got(size_t(e - b) + 1);
    reader.read(s.name, s.shape, DType::BF16, got.data(), b, e - b);
    auto want = make_values(6, DType::BF16, b, e - b);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), size_t(e - b) * 2), 0);
  }
}

TEST(CheckpointMpi, VerifyDetectsCorruptedByte) {
  SharedDir dir("h5mpi_verify");
  std::string path = dir / "c.h5";
  write_checkpoint(path);
  ChecksumReport rep = verify_checksums(path, MPI_COMM_WORLD);
  EXPECT_TRUE(rep.ok()) << (rep.problems.empty() ? "" : rep.problems[0]);
  EXPECT_EQ(rep.datasets, int64_t(kSpecs.size()));
  EXPECT_EQ(rep.slices, [] {  // one slice per rank that owned elements
    int64_t n = 0;
    for (const Spec& s : kSpecs)
      for (int r = 0; r < world_size(); ++r) n += shard(shape_numel(s.shape), r, world_size()).second > shard(shape_numel(s.shape), r, world_size()).first;
    return n;
  }());
  // Rank 0 flips one byte of /optimizer/a/exp_avg element 600 in place.
  if (world_rank() == 0) {
    EXPECT_TRUE(verify_checksums(path).ok());  // the serial path agrees
    int64_t off = H5File::open(path).dataset_info("/optimizer/a/exp_avg").file_offset;
    EXPECT_GT(off, 0);
    FILE* f = std::fopen(path.c_str(), "r+b");
    EXPECT_NE(f, nullptr);
    if (f && off > 0) {
      std::fseek(f, long(off + 600 * 4 + 1), SEEK_SET);
      int c = std::fgetc(f);
      std::fseek(f, long(off + 600 * 4 + 1), SEEK_SET);
      std::fputc(c ^ 0x01, f);
    }
    if (f) std::fclose(f);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  rep = verify_checksums(path, MPI_COMM_WORLD);
  ASSERT_EQ(rep.problems.size(), 1u);  // every rank gets the full report
  auto [b, e] = shard(1001, 0, 1);
  for (int k = 0; k < world_size(); ++k) {
    std::tie(b, e) = shard(1001, k, world_size());
    if (b <= 600 && 600 < e) break;
  }
  std::string want = "/optimizer/a/exp_avg: elements [" + std::to_string(b) + ", " + std::to_string(e) + "): crc32";
  EXPECT_NE(rep.problems[0].find(want), std::string::npos) << rep.problems[0];
}

TEST(CheckpointMpi, FailureOnOneRankKeepsPrevious) {
  SharedDir dir("h5mpi_failure");
  std::string path = dir / "c.h5";
  write_checkpoint(path);
  int r = world_rank(), world = world_size();
  // The last rank passes a range past the end: every rank throws the same error naming the file.
  std::vector<float> x(2000, 9.f);
  int threw = 0;
  try {
    CheckpointWriter w(path, MPI_COMM_WORLD);
    auto [b, e] = shard(1001, r, world);
    if (r == world - 1) e = 1002;
    w.write("/optimizer/a/exp_avg", DType::F32, {1001}, DType::F32, x.data(), b, e - b);
    w.commit();
  } catch (const Error& err) {
    threw = 1;
    EXPECT_NE(std::string(err.what()).find(path), std::string::npos) << err.what();
  }
  EXPECT_EQ(threw, 1);
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  CheckpointReader reader(path, MPI_COMM_WORLD);
  auto [b, e] = shard(1001, r, world);
  EXPECT_EQ(read_and_check(reader, 5, b, e - b), 0);
  EXPECT_TRUE(verify_checksums(path, MPI_COMM_WORLD).ok());
}

// Collective reads of ranges that overlap between ranks (several ranks loading the same weights).
// Open MPI 4.1.4's ompio got these wrong with collective MPI-IO reads; see H5File.
TEST(CheckpointMpi, OverlappingReads) {
  SharedDir dir("h5mpi_overlap");
  std::string path = dir / "c.h5";
  write_checkpoint(path);
  CheckpointReader reader(path, MPI_COMM_WORLD);
  int r = world_rank();
  const int64_t n = 91;  // /model/a
  struct Case { int64_t off[5], cnt[5]; };
  const Case cases[] = {
      {{4, 4, 4, 4, 4}, {86, 86, 86, 86, 86}},  // the same range everywhere
      {{4, 50, 0, 7, 80}, {86, 20, 91, 3, 11}},  // partial overlaps
      {{0, 10, 12, 0, 90}, {n, 5, 0, 91, 1}},    // nested
  };
  for (const Case& c : cases) EXPECT_EQ(read_and_check(reader, 0, c.off[r], c.cnt[r]), 0) << "rank " << r;
}

TEST(CheckpointMpi, RotationKeepsNewest) {
  SharedDir dir("h5mpi_rotation");
  for (int64_t step : {10, 20, 30}) write_checkpoint(dir / checkpoint_filename(step));
  auto deleted = keep_last_checkpoints(dir.str(), "step-", 2, MPI_COMM_WORLD);
  EXPECT_EQ(deleted.size(), world_rank() == 0 ? 1u : 0u);
  auto all = list_checkpoints(dir.str());
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].step, 20);
  EXPECT_EQ(latest_checkpoint(dir.str()).value_or(""), dir / "step-00000030.h5");
}

// H5File directly: ranks with different transfer limits make different numbers of pieces, some
// ranks pass empty ranges, and a chunked layout, all in one collective call.
TEST(H5FileMpi, CollectiveSlicesWithPiecesAndEmptyRanks) {
  SharedDir dir("h5mpi_h5file");
  std::string path = dir / "f.h5";
  int r = world_rank(), world = world_size();
  const Shape shape = {9, 11};
  const int64_t n = 99;
  {
    H5File f = H5File::create(path, MPI_COMM_WORLD);
    EXPECT_EQ(f.parallel(), world > 1);
    f.create_dataset("/x/y", DType::F32, shape, {4, 4});
    if (r == 0) f.set_max_io_bytes(40);  // 10 f32 per call
    // Rank 0 writes nothing; the others split the array.
    auto [b, e] = r == 0 && world > 1 ? std::pair<int64_t, int64_t>{0, 0} : shard(n, world > 1 ? r - 1 : 0, std::max(1, world - 1));
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(i);
    f.write_slice("/x/y", DType::F32, v.data() + b, b, e - b);
    f.set_attr_bytes("/x", "rng", {1, 2, 3});
    f.close();
  }
  H5File f = H5File::open(path, false, MPI_COMM_WORLD);
  if (r == 0) f.set_max_io_bytes(24);
  EXPECT_EQ(f.dataset_info("/x/y").chunk, (Shape{4, 4}));
  EXPECT_EQ(f.attr_bytes("/x", "rng"), (std::vector<uint8_t>{1, 2, 3}));
  // Every rank reads the whole array as bf16 (a conversion, in pieces on rank 0).
  std::vector<bf16> all(static_cast<size_t>(n));
  f.read_slice("/x/y", DType::BF16, all.data(), 0, n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(float(all[size_t(i)]), float(bf16(float(i)))) << i;
  // A bad range on one rank: all ranks throw, none hangs.
  std::vector<float> tmp(200);
  int threw = 0;
  try {
    f.read_slice("/x/y", DType::F32, tmp.data(), r == world - 1 ? 90 : 0, r == world - 1 ? 20 : 5);
  } catch (const Error& e) {
    threw = 1;
    EXPECT_NE(std::string(e.what()).find("/x/y"), std::string::npos) << e.what();
  }
  EXPECT_EQ(threw, 1);
}

// h5py (Debian's python3-h5py) reads the checkpoint as ordinary named arrays.
TEST(CheckpointMpi, H5pyReadsCheckpoint) {
  int have = 0;
  if (world_rank() == 0)
    have = ::access("/usr/bin/python3", X_OK) == 0 &&
           std::system("/usr/bin/python3 -c 'import h5py, numpy' > /dev/null 2>&1") == 0;
  MPI_Bcast(&have, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!have) GTEST_SKIP() << "/usr/bin/python3 with h5py and numpy not found";
  SharedDir dir("h5mpi_h5py");
  std::string path = dir / "c.h5";
  write_checkpoint(path);
  if (world_rank() == 0) {
    std::string script = (fs::path(__FILE__).parent_path().parent_path() / "h5py_reads_checkpoint.py").string();
    ASSERT_TRUE(fs::exists(script)) << script;
    std::string out_path = dir / "h5py.json";
    std::string cmd = "/usr/bin/python3 '" + script + "' '" + path + "' > '" + out_path + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    nlohmann::json j = nlohmann::json::parse(std::ifstream(out_path));
    EXPECT_EQ(j["format"], 1);
    EXPECT_EQ(j["attrs"]["step"], 123);
    EXPECT_EQ(j["attrs"]["checksum"], "crc32");
    EXPECT_EQ(j["attrs"]["config"], R"({"zero_optimization": {"stage": 3}})");
    for (size_t id = 0; id < kSpecs.size(); ++id) {
      const Spec& s = kSpecs[id];
      const auto& d = j["datasets"][s.name];
      ASSERT_FALSE(d.is_null()) << s.name;
      EXPECT_EQ(d["shape"].get<Shape>(), s.shape) << s.name;
      EXPECT_EQ(d["crc_ok"], true) << s.name;
      // h5py's numpy dtypes: our bf16 type becomes float32 (exactly), our f16 type float16.
      const char* want_dtype = s.file_dtype == DType::F16 ? "float16" : "float32";
      EXPECT_EQ(d["dtype"], want_dtype) << s.name;
      if (s.file_dtype == DType::BF16) EXPECT_EQ(d["bf16_exact"], true) << s.name;
      auto values = d["values"].get<std::vector<double>>();
      ASSERT_EQ(int64_t(values.size()), shape_numel(s.shape)) << s.name;
      for (size_t i = 0; i < values.size(); ++i)
        ASSERT_EQ(values[i], double(value(int(id), int64_t(i)))) << s.name << " element " << i;
    }
  }
}

}  // namespace
}  // namespace zp::io
