#include <filesystem>
#include <fstream>
#include <set>

#include "io/token_dataset.h"
#include "test_util.h"

namespace zp::test {
using namespace zp::io;
namespace fs = std::filesystem;

TEST(TokenDataset, WindowsShiftAndShuffle) {
  fs::path p = fs::temp_directory_path() / "zp_tokens_a.bin";
  std::vector<int32_t> toks(101);
  for (int i = 0; i < 101; ++i) toks[size_t(i)] = i;
  write_token_file(p, toks, 256);
  TokenDataset ds({p.string()}, 10);
  EXPECT_EQ(ds.num_windows(), 10);  // windows start at 0,10,...,90 and need 11 tokens
  std::vector<int32_t> x(10), y(10);
  ds.window(3, x.data(), y.data());
  EXPECT_EQ(x[0], 30);
  EXPECT_EQ(y[0], 31);
  EXPECT_EQ(y[9], 40);
  std::set<int64_t> seen;
  for (int64_t i = 0; i < ds.num_windows(); ++i) seen.insert(ds.epoch_order(7, 0, i));
  EXPECT_EQ(seen.size(), 10u) << "an epoch visits every window once";
  bool differs = false;
  for (int64_t i = 0; i < ds.num_windows(); ++i) differs |= ds.epoch_order(7, 0, i) != ds.epoch_order(7, 1, i);
  EXPECT_TRUE(differs) << "a new epoch reshuffles";
  TokenDataset val({p.string()}, 10, 0.8, 1.0);
  EXPECT_EQ(val.num_windows(), 2);
  val.window(0, x.data(), y.data());
  EXPECT_EQ(x[0], 80);
  fs::remove(p);
}

TEST(TokenDataset, ReadsLlmcAndWideTokens) {
  fs::path p = fs::temp_directory_path() / "zp_tokens_llmc.bin";
  {
    int32_t h[256] = {kLlmcTokenMagic, 1, 5};
    uint16_t t[5] = {50256, 1, 2, 3, 4};
    std::ofstream o(p, std::ios::binary);
    o.write(reinterpret_cast<const char*>(h), sizeof(h));
    o.write(reinterpret_cast<const char*>(t), sizeof(t));
  }
  TokenFile f(p.string());
  EXPECT_EQ(f.size(), 5);
  EXPECT_EQ(f.at(0), 50256);
  fs::path q = fs::temp_directory_path() / "zp_tokens_wide.bin";
  write_token_file(q, {1, 151000, 3}, 151936);
  TokenFile g(q.string());
  EXPECT_EQ(g.token_bytes(), 4);
  EXPECT_EQ(g.at(1), 151000);
  EXPECT_EQ(g.vocab_size(), 151936);
  fs::remove(p);
  fs::remove(q);
}

TEST(TokenDataset, BadFilesNameTheFile) {
  fs::path p = fs::temp_directory_path() / "zp_tokens_bad.bin";
  {
    int32_t h[256] = {kTokenFileMagic, 1, 2, 1000, 0, 0};
    std::ofstream o(p, std::ios::binary);
    o.write(reinterpret_cast<const char*>(h), sizeof(h));  // promises 1000 tokens, holds none
  }
  try {
    TokenFile f(p.string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("1000 tokens"), std::string::npos) << e.what();
  }
  std::ofstream(p, std::ios::trunc) << std::string(2000, 'x');
  EXPECT_THROW(TokenFile(p.string()), Error);
  EXPECT_THROW(TokenDataset({p.string()}, 0), Error);
  fs::remove(p);
}

}  // namespace zp::test
