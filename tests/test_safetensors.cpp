#include <filesystem>
#include <fstream>

#include "io/safetensors.h"
#include "test_util.h"

namespace zp::test {
using namespace zp::io;
namespace fs = std::filesystem;

TEST(Safetensors, ReadsHubFile) {
  std::string p = golden_path("gpt2-tiny/model.safetensors");
  SafetensorsFile f(p);
  const auto& e = f.entry("transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(e.dtype, DType::F32);
  EXPECT_EQ(e.shape, (Shape{64, 192}));
  Tensor t = f.read("transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(t.numel(), 64 * 192);
  EXPECT_FALSE(f.contains("lm_head.weight"));  // tied: the file omits it
  EXPECT_EQ(f.metadata().at("format"), "pt");
}

TEST(Safetensors, RoundTripAndConvert) {
  fs::path p = fs::temp_directory_path() / "zp_st_roundtrip.safetensors";
  auto v = randn(15, 7);
  Tensor a = upload(v, DType::F32, Device::cpu()).view({3, 5});
  Tensor b = upload({1, 2, 3}, DType::I64, Device::cpu());
  write_safetensors(p, {{"a", a}, {"b.ids", b}}, {{"note", "x"}});
  SafetensorsFile f(p);
  EXPECT_EQ(download(f.read("a")), v);
  EXPECT_EQ(f.entry("a").shape, (Shape{3, 5}));
  EXPECT_EQ(download(f.read("b.ids")), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(download(f.read_as("a", DType::BF16)), round_to(v, DType::BF16));
  EXPECT_THROW(f.read_as("b.ids", DType::F32), Error);
  EXPECT_THROW(f.entry("missing"), Error);
  fs::remove(p);
}

static std::string write_raw(const std::string& name, const std::string& header, size_t data_bytes) {
  fs::path p = fs::temp_directory_path() / name;
  std::ofstream o(p, std::ios::binary);
  uint64_t n = header.size();
  o.write(reinterpret_cast<const char*>(&n), 8);
  o << header << std::string(data_bytes, '\0');
  return p.string();
}

TEST(Safetensors, RejectsCorruptFiles) {
  auto expect_error = [](const std::string& path, const std::string& fragment) {
    try {
      SafetensorsFile f(path);
      ADD_FAILURE() << path << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << "error must name the file";
    }
  };
  expect_error(write_raw("zp_bad1.st", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
               "outside the data section");
  expect_error(write_raw("zp_bad2.st", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", 16),
               "shape x dtype");
  expect_error(write_raw("zp_bad3.st", R"({"w":{"dtype":"Q7","shape":[4],"data_offsets":[0,16]}})", 16), "Q7");
  expect_error(write_raw("zp_bad4.st", R"({"w": nope)", 0), "not JSON");
  expect_error(write_raw("zp_bad5.st", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16),
               "overlap");
  fs::path p = fs::temp_directory_path() / "zp_bad6.st";
  std::ofstream(p) << "abc";
  expect_error(p.string(), "shorter");
  // A header length pointing past the end.
  fs::path q = fs::temp_directory_path() / "zp_bad7.st";
  {
    std::ofstream o(q, std::ios::binary);
    uint64_t n = 1ull << 40;
    o.write(reinterpret_cast<const char*>(&n), 8);
  }
  expect_error(q.string(), "exceeds the file size");
  expect_error("/nonexistent/zp.st", "cannot open");
}

TEST(Safetensors, ShardedIndex) {
  fs::path dir = fs::temp_directory_path() / "zp_sharded";
  fs::create_directories(dir);
  write_safetensors((dir / "model-00001-of-00002.safetensors").string(), {{"x", upload({1, 2}, DType::F32, Device::cpu())}});
  write_safetensors((dir / "model-00002-of-00002.safetensors").string(), {{"y", upload({3}, DType::F32, Device::cpu())}});
  std::ofstream(dir / "model.safetensors.index.json")
      << R"({"metadata":{},"weight_map":{"x":"model-00001-of-00002.safetensors","y":"model-00002-of-00002.safetensors"}})";
  auto c = SafetensorsCollection::open_dir(dir.string(), "model");
  EXPECT_EQ(c.names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(download(c.file_of("y").read("y")), (std::vector<float>{3}));
  std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map":{"z":"model-00001-of-00002.safetensors"}})";
  EXPECT_THROW(SafetensorsCollection::open_dir(dir.string(), "model"), Error);
  fs::remove_all(dir);
}

}  // namespace zp::test
