// Regression tests for hostile inputs to the file readers, one per hole that mutation fuzzing
// (test_fuzz_readers.cpp) found or that the readers' contracts promise to close: each must be a
// zp::Error naming the file (and the tensor or dataset), never a crash, a wrapped size or a late abort.
#include <hdf5.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "app/inspect_command.h"
#include "io/checkpoint_file.h"
#include "io/h5file.h"
#include "io/latent_dataset.h"
#include "io/safetensors.h"
#include "io/token_dataset.h"
#include "test_util.h"

namespace zp::test {
namespace {
using namespace zp::io;
namespace fs = std::filesystem;

// Scratch folders <temp>/zp_hostile_<name>_<pid>.
struct Dir : ScratchFolder {
  explicit Dir(const std::string& name) : ScratchFolder("hostile_" + name) {}
};

// --- token files ------------------------------------------------------------------------------

// A token file in our layout with the given header fields and raw token bytes.
std::string token_file(const std::string& path, const std::vector<int32_t>& header, const std::string& tokens) {
  int32_t h[256] = {0};
  for (size_t i = 0; i < header.size(); ++i) h[i] = header[i];
  std::ofstream o(path, std::ios::binary);
  o.write(reinterpret_cast<const char*>(h), sizeof h);
  o << tokens;
  return path;
}

template <class T> std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

TEST(TokenDatasetHostile, CheckVocabNamesFilePositionAndId) {
  Dir dir("vocab");
  std::vector<int32_t> ids(100, 5);
  ids[70] = 299;
  const std::string ok = dir / "ok.bin";
  write_token_file(ok, ids, 300);
  TokenDataset({ok}, 8).check_vocab(300);  // every id is inside

  // The model's vocabulary is smaller than an id of the file: the run would abort in the embedding.
  expect_error([&] { TokenDataset({ok}, 8).check_vocab(200); }, {ok, "token 70", "id 299", "model's vocabulary of 200"});

  // An id beyond the vocabulary the header declares, though the model could embed it.
  std::vector<uint16_t> narrow(100, 5);
  narrow[42] = 310;
  const std::string lying = token_file(dir / "lying.bin", {kTokenFileMagic, 1, 2, 100, 0, 300}, raw(narrow));
  expect_error([&] { TokenDataset({lying}, 8).check_vocab(50257); }, {lying, "token 42", "id 310", "header declares"});

  // A 4-byte id of 2^31 or more: negative as an int32, so a signed comparison would pass it.
  std::vector<uint32_t> wide(100, 7);
  wide[99] = 0x80000000u;
  const std::string huge = token_file(dir / "huge.bin", {kTokenFileMagic, 1, 4, 100, 0, 0}, raw(wide));
  expect_error([&] { TokenDataset({huge}, 8).check_vocab(151936); }, {huge, "token 99", "id 2147483648"});

  // Several files: the error names the bad one.
  expect_error([&] { TokenDataset({ok, huge}, 8).check_vocab(151936); }, {huge, "token 99"});
  expect_error([&] { TokenDataset({ok}, 8).check_vocab(0); }, {ok, "vocabulary of 0"});
}

TEST(TokenDatasetHostile, BadHeadersNameTheFile) {
  Dir dir("headers");
  const std::string tokens = raw(std::vector<uint16_t>(16, 1));
  const std::string negative = token_file(dir / "negative.bin", {kTokenFileMagic, 1, 2, 16, 0, -5}, tokens);
  expect_error([&] { TokenFile f(negative); }, {negative, "vocabulary size -5", "negative"});
  // 0 is "unknown", not an error.
  EXPECT_EQ(TokenFile(token_file(dir / "unknown.bin", {kTokenFileMagic, 1, 2, 16, 0, 0}, tokens)).vocab_size(), 0);
  const std::string three = token_file(dir / "three.bin", {kTokenFileMagic, 1, 3, 16, 0, 0}, tokens);
  expect_error([&] { TokenFile f(three); }, {three, "bytes per token must be 2 or 4"});
  // More tokens than the file holds.
  const std::string short_file = token_file(dir / "short.bin", {kTokenFileMagic, 1, 2, 17, 0, 0}, tokens);
  expect_error([&] { TokenFile f(short_file); }, {short_file, "header says 17 tokens"});
  // 2^63 + 16 tokens of 2 bytes is 2^64 + 32 bytes, which wraps to exactly what the file holds; it
  // was accepted with a negative token count.
  const std::string wraps =
      token_file(dir / "wraps.bin", {kTokenFileMagic, 1, 2, 16, int32_t(0x80000000u), 0}, tokens);
  expect_error([&] { TokenFile f(wraps); }, {wraps, "header says 9223372036854775824 tokens"});
  // Odd leftover bytes.
  const std::string odd = token_file(dir / "odd.bin", {kTokenFileMagic, 1, 2, 16, 0, 0}, tokens + "x");
  expect_error([&] { TokenFile f(odd); }, {odd, "header says 16 tokens"});
}

TEST(TokenDatasetHostile, WriterRefusesWhatTheReaderRejects) {
  Dir dir("writer");
  expect_error([&] { write_token_file(dir / "a.bin", {1, 2, 300}, 300); }, {"a.bin", "300", "outside the vocabulary"});
  expect_error([&] { write_token_file(dir / "b.bin", {1, 2}, -1); }, {"b.bin", "negative"});
}

// --- safetensors ------------------------------------------------------------------------------

std::string safetensors_raw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::ofstream o(path, std::ios::binary);
  const uint64_t n = header.size();
  o.write(reinterpret_cast<const char*>(&n), 8);
  o << header << std::string(data_bytes, '\0');
  return path;
}

// The error for a file holding only tensor "w" described by `entry`, with 16 data bytes.
void expect_entry_error(const Dir& dir, const std::string& entry, const std::vector<std::string>& fragments) {
  const std::string p = safetensors_raw(dir / "e.safetensors", R"({"w": )" + entry + "}", 16);
  std::vector<std::string> all = {p, "'w'"};
  all.insert(all.end(), fragments.begin(), fragments.end());
  expect_error([&] { SafetensorsFile f(p); }, all);
}

TEST(SafetensorsHostile, EntriesMustBeExactIntegers) {
  Dir dir("entries");
  // nlohmann's get<int64_t> truncates 2.5 and takes true for 1: these were accepted as [2, 2] and [1, 4].
  expect_entry_error(dir, R"({"dtype": "F32", "shape": [2.5, 2], "data_offsets": [0, 16]})", {"shape entry 2.5"});
  expect_entry_error(dir, R"({"dtype": "F32", "shape": [true, 4], "data_offsets": [0, 16]})", {"shape entry true"});
  expect_entry_error(dir, R"({"dtype": "F32", "shape": [-1], "data_offsets": [0, 16]})", {"shape entry -1"});
  expect_entry_error(dir, R"({"dtype": "F32", "shape": ["4"], "data_offsets": [0, 16]})", {"shape entry \"4\""});
  // A number as shape iterated as a one-element array.
  expect_entry_error(dir, R"({"dtype": "F32", "shape": 4, "data_offsets": [0, 16]})", {"shape is not an array"});
  expect_entry_error(dir, R"({"dtype": 7, "shape": [4], "data_offsets": [0, 16]})", {"dtype is not a string"});
  // -1 became 2^64-1, 16.0 became 16.
  expect_entry_error(dir, R"({"dtype": "F32", "shape": [4], "data_offsets": [-1, 15]})", {"data_offsets"});
  expect_entry_error(dir, R"({"dtype": "F32", "shape": [4], "data_offsets": [0, 16.0]})", {"data_offsets"});
  expect_entry_error(dir, R"({"dtype": "F32", "shape": [4], "data_offsets": {"a": 0, "b": 16}})", {"data_offsets"});
  expect_entry_error(dir, R"({"dtype": "F32", "shape": [4], "data_offsets": [0, 16, 32]})", {"data_offsets"});
  expect_entry_error(dir, R"([1, 2])", {"needs dtype, shape and data_offsets"});
}

TEST(SafetensorsHostile, SizesThatOverflow) {
  Dir dir("overflow");
  // 2^62 x 4 elements of 4 bytes is 2^66 bytes, which wraps to 0 and matched an empty range.
  expect_entry_error(dir, R"({"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 0]})",
                     {"more elements than 64-bit sizes can count"});
  expect_entry_error(dir, R"({"dtype": "F32", "shape": [9223372036854775808], "data_offsets": [0, 0]})",
                     {"shape entry 9223372036854775808"});
  std::string rank33 = "[";
  for (int i = 0; i < 33; ++i) rank33 += std::string(i ? ", " : "") + "1";
  rank33 += "]";
  expect_entry_error(dir, R"({"dtype": "U8", "shape": )" + rank33 + R"(, "data_offsets": [0, 1]})", {"33 dimensions"});
  // A zero dimension keeps the count at 0 whatever follows, within int64.
  const std::string zero = safetensors_raw(
      dir / "zero.safetensors", R"({"w": {"dtype": "F32", "shape": [0, 9223372036854775807], "data_offsets": [0, 0]}})", 0);
  EXPECT_EQ(SafetensorsFile(zero).entry("w").shape, (Shape{0, INT64_MAX}));
}

TEST(SafetensorsHostile, OverlapBehindAnEmptyRange) {
  Dir dir("overlap");
  // Sorted: [0, 16), [4, 4), [8, 16): comparing each range with its neighbour only missed the overlap.
  const std::string p = safetensors_raw(dir / "o.safetensors",
                                        R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                            "b": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
                                            "c": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
                                        16);
  expect_error([&] { SafetensorsFile f(p); }, {p, "overlap"});
}

TEST(SafetensorsHostile, HeaderShapes) {
  Dir dir("header");
  const std::string array = safetensors_raw(dir / "array.safetensors", "[]", 0);
  expect_error([&] { SafetensorsFile f(array); }, {array, "not a JSON object"});
  // Nesting deep enough to overflow the stack when dumped: refused while parsing.
  const std::string deep = safetensors_raw(
      dir / "deep.safetensors", R"({"__metadata__": {"k": )" + std::string(100000, '[') + std::string(100000, ']') + "}}", 0);
  expect_error([&] { SafetensorsFile f(deep); }, {deep, "nested deeper"});
  const std::string meta = safetensors_raw(dir / "meta.safetensors", R"({"__metadata__": 5})", 0);
  expect_error([&] { SafetensorsFile f(meta); }, {meta, "__metadata__"});
  // A header length within the file but above the format's limit (a sparse file, so this is cheap).
  const std::string big = dir / "big.safetensors";
  {
    std::ofstream o(big, std::ios::binary);
    const uint64_t n = 100'000'001;
    o.write(reinterpret_cast<const char*>(&n), 8);
  }
  fs::resize_file(big, 100'000'009);
  expect_error([&] { SafetensorsFile f(big); }, {big, "above the format's limit"});
}

TEST(SafetensorsHostile, IndexWithANonStringShard) {
  Dir dir("index");
  std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map": {"w": 3}})";
  expect_error([&] { SafetensorsCollection::open_dir(dir / "", "model"); }, {"model.safetensors.index.json", "'w'"});
}

// --- HDF5 -------------------------------------------------------------------------------------

hid_t open_objects() { return H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL); }

// A dataset created with the C API (chunked, allocated late, so no storage is needed) of any dims.
void raw_dataset(const std::string& path, const char* name, const std::vector<hsize_t>& dims, hid_t type) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t space = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
  ASSERT_GE(space, 0);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  std::vector<hsize_t> chunk(dims.size(), 1);
  H5Pset_chunk(dcpl, int(chunk.size()), chunk.data());
  H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_LATE);
  hid_t d = H5Dcreate2(f, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  EXPECT_GE(d, 0) << "HDF5 refused to create " << name;
  if (d >= 0) H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Fclose(f);
}

TEST(H5FileHostile, ShapeWhoseCountOverflows) {
  Dir dir("count");
  const std::string p = dir / "big.h5";
  // 2^40 x 2^40 elements: the count wrapped in shape_numel and every range check passed.
  raw_dataset(p, "x", {hsize_t(1) << 40, hsize_t(1) << 40}, H5T_NATIVE_FLOAT);
  const hid_t before = open_objects();
  {
    H5File f = H5File::open(p);
    expect_error([&] { f.dataset_info("x"); }, {p, "/x", "[1099511627776, 1099511627776]", "more elements"});
    std::vector<float> v(4);
    expect_error([&] { f.read_slice("x", DType::F32, v.data(), 0, 4); }, {p, "/x", "more elements"});
  }
  EXPECT_EQ(open_objects(), before) << "an error path left HDF5 objects open";
}

TEST(H5FileHostile, CreateValidatesRankAndSize) {
  Dir dir("create");
  const std::string p = dir / "c.h5";
  H5File f = H5File::create(p);
  // Used to abort inside H5Screate_simple (checked) instead of throwing.
  expect_error([&] { f.create_dataset("r33", DType::F32, Shape(33, 1)); }, {p, "/r33", "33 dimensions", "at most 32"});
  expect_error([&] { f.create_dataset("wrap", DType::F32, {int64_t(1) << 62, 4}); }, {p, "/wrap", "more elements"});
  expect_error([&] { f.create_dataset("chunk", DType::F32, {int64_t(1) << 40}, {int64_t(1) << 33}); },
               {p, "/chunk", "larger than HDF5 allows"});
  expect_error([&] { f.create_dataset("chunk2", DType::F64, {int64_t(1) << 31}, {int64_t(1) << 30}); },
               {p, "/chunk2", "less than 4 GiB"});
  f.create_dataset("r32", DType::U8, Shape(32, 1));  // the limit itself is fine
  EXPECT_EQ(f.dataset_info("r32").shape.size(), 32u);
}

TEST(H5FileHostile, ErrorPathsLeaveNothingOpen) {
  Dir dir("leaks");
  const std::string p = dir / "l.h5";
  {
    H5File f = H5File::create(p);
    f.create_dataset("/g/d", DType::F32, {4});
    f.set_attr_string("/", "s", "text");
    f.set_attr_ints("/", "ints", {1, 2, 3});
    f.close();
  }
  const hid_t before = open_objects();
  {
    H5File f = H5File::open(p);
    expect_error([&] { f.dataset_info("/g"); }, {p, "/g", "group"});
    expect_error([&] { f.attr_int("/", "s"); }, {p, "'s'", "not a single integer"});
    expect_error([&] { f.attr_string("/", "ints"); }, {p, "'ints'", "not a string"});
    expect_error([&] { f.attr_bytes("/", "missing"); }, {p, "missing"});
    std::vector<int64_t> i64(4);
    expect_error([&] { f.read_slice("/g/d", DType::I64, i64.data(), 0, 4); }, {p, "/g/d", "f32"});
    EXPECT_EQ(f.attr_shape("/", "ints"), (Shape{3}));
  }
  EXPECT_EQ(open_objects(), before);
}

// --- inspect --verify -------------------------------------------------------------------------

TEST(H5FileHostile, InspectVerifyFailsWhenNothingCouldBeVerified) {
  Dir dir("inspect");
  // A ZeRO-Pipe file without /model: there is nothing to verify, which is a failure, not "ok".
  const std::string empty = dir / "empty.h5";
  {
    CheckpointWriter w(empty);
    w.file().set_attr_string("/", "kind", "weights");
    w.commit();
  }
  app::InspectReport r = app::inspect_report(empty, true);
  EXPECT_FALSE(r.ok) << r.text;
  EXPECT_NE(r.text.find("checksums: FAILED"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("no /model group"), std::string::npos) << r.text;

  // /model holds a tensor written without checksums (another tool) and a link that leads nowhere.
  const std::string unchecked = dir / "unchecked.h5";
  {
    H5File f = H5File::create(unchecked);
    f.set_attr_int("/", "zeropipe_format", 1);
    f.create_dataset("/model/w", DType::F32, {4});
    std::vector<float> v(4, 1.f);
    f.write_slice("/model/w", DType::F32, v.data(), 0, 4);
    f.close();
    hid_t id = H5Fopen(unchecked.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(id, 0);
    ASSERT_GE(H5Lcreate_soft("/nowhere", id, "/model/dangling", H5P_DEFAULT, H5P_DEFAULT), 0);
    H5Fclose(id);
  }
  r = app::inspect_report(unchecked, true);
  EXPECT_FALSE(r.ok) << r.text;
  EXPECT_NE(r.text.find("no dataset carries slice checksums"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("/model/dangling: cannot be read"), std::string::npos) << r.text;

  // Not a ZeRO-Pipe file: nothing is promised, so nothing fails.
  const std::string plain = dir / "plain.h5";
  {
    H5File f = H5File::create(plain);
    f.create_dataset("x", DType::F32, {2});
  }
  EXPECT_TRUE(app::inspect_report(plain, true).ok);

  // And a good file passes.
  const std::string good = dir / "good.h5";
  {
    CheckpointWriter w(good);
    std::vector<float> v(8, 2.f);
    w.write("/model/w", DType::F32, {8}, DType::F32, v.data(), 0, 8);
    w.commit();
  }
  r = app::inspect_report(good, true);
  EXPECT_TRUE(r.ok) << r.text;
  EXPECT_NE(r.text.find("checksums: ok (1 datasets"), std::string::npos) << r.text;
}

TEST(H5FileHostile, InspectRefusesLinkCycles) {
  Dir dir("cycle");
  const std::string p = dir / "cycle.h5";
  {
    CheckpointWriter w(p);
    std::vector<float> v(4, 1.f);
    w.write("/model/w", DType::F32, {4}, DType::F32, v.data(), 0, 4);
    w.commit();
  }
  const std::string shared = dir / "shared.h5";
  fs::copy_file(p, shared);
  auto link = [](const std::string& file, const char* target, const char* name) {
    hid_t id = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(id, 0);
    EXPECT_GE(H5Lcreate_hard(id, target, id, name, H5P_DEFAULT, H5P_DEFAULT), 0);
    H5Fclose(id);
  };
  // /model/loop is /model itself: listing the tree recursed until the stack overflowed.
  link(p, "/model", "/model/loop");
  expect_error([&] { app::inspect_report(p, true); }, {p, "'/model/loop'", "'/model'", "link"});
  // The same group under two names: finite, but each such link doubles the walk, so refused too.
  link(shared, "/model", "/copy");
  expect_error([&] { app::inspect_report(shared, false); }, {shared, "'/model'", "'/copy'"});
  H5File f = H5File::open(p);
  EXPECT_EQ(f.object_id("/model"), f.object_id("/model/loop"));
  EXPECT_NE(f.object_id("/model"), f.object_id("/model/w"));
  expect_error([&] { f.object_id("/nope"); }, {p, "/nope"});
}

// --- latent files -----------------------------------------------------------------------------

TEST(H5FileHostile, LatentFileShapes) {
  Dir dir("latents");
  // One sample of 4 x 2^15 x 2^15 latents (2^32 elements, 16 GiB as fp32): a damaged shape, which
  // would have the caller allocate that much per sample.
  const std::string p = dir / "huge.h5";
  {
    hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    auto add = [&](const char* name, std::vector<hsize_t> dims) {
      hid_t space = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
      hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
      std::vector<hsize_t> chunk(dims.size(), 1);
      H5Pset_chunk(dcpl, int(chunk.size()), chunk.data());
      hid_t d = H5Dcreate2(f, name, H5T_NATIVE_FLOAT, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
      EXPECT_GE(d, 0);
      H5Dclose(d);
      H5Pclose(dcpl);
      H5Sclose(space);
    };
    add("latents", {1, 4, 1 << 15, 1 << 15});
    add("encoder_hidden_states", {1, 77, 768});
    H5Fclose(f);
  }
  expect_error([&] { LatentDataset ds(p); }, {p, "'latents'", "elements per sample"});
  // An overflowing count is refused by dataset_info before any arithmetic on it.
  const std::string q = dir / "wrap.h5";
  raw_dataset(q, "latents", {hsize_t(1) << 40, 4, hsize_t(1) << 20, hsize_t(1) << 20}, H5T_NATIVE_FLOAT);
  expect_error([&] { LatentDataset ds(q); }, {q, "/latents", "more elements"});
}

}  // namespace
}  // namespace zp::test
