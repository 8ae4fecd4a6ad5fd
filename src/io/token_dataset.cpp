#include "io/token_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>

#include "core/error.h"

namespace zp::io {

TokenFile::TokenFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZP_REQUIRE(fd_ >= 0, path, ": cannot open token file: ", std::strerror(errno));
  struct stat st {};
  ZP_REQUIRE(fstat(fd_, &st) == 0, path, ": cannot stat");
  map_size_ = size_t(st.st_size);
  auto fail = [&](const std::string& why) {
    if (map_) munmap(map_, map_size_);
    ::close(fd_);
    map_ = nullptr;
    fd_ = -1;
    throw Error(path + ": not a token file: " + why);
  };
  constexpr size_t kHeader = 256 * sizeof(int32_t);
  if (map_size_ < kHeader) fail("shorter than the 1024-byte header");
  map_ = mmap(nullptr, map_size_, PROT_READ, MAP_SHARED, fd_, 0);
  if (map_ == MAP_FAILED) { map_ = nullptr; fail(std::string("mmap: ") + std::strerror(errno)); }
  const auto* h = static_cast<const int32_t*>(map_);
  if (h[0] == kTokenFileMagic) {
    if (h[1] != 1) fail("unsupported version " + std::to_string(h[1]));
    if (h[2] != 2 && h[2] != 4) fail("bytes per token must be 2 or 4, header says " + std::to_string(h[2]));
    token_bytes_ = h[2];
    n_tokens_ = int64_t(uint32_t(h[3])) | (int64_t(uint32_t(h[4])) << 32);
    vocab_ = h[5];
  } else if (h[0] == kLlmcTokenMagic) {
    if (h[1] != 1) fail("unsupported llm.c version " + std::to_string(h[1]));
    token_bytes_ = 2;
    n_tokens_ = int64_t(uint32_t(h[2]));
  } else {
    fail("unknown magic " + std::to_string(h[0]));
  }
  size_t want = kHeader + size_t(n_tokens_) * size_t(token_bytes_);
  if (map_size_ != want)
    fail("header says " + std::to_string(n_tokens_) + " tokens (" + std::to_string(want) + " bytes) but the file has " +
         std::to_string(map_size_) + " bytes");
  tokens_ = static_cast<const char*>(map_) + kHeader;
  madvise(map_, map_size_, MADV_RANDOM);
}

TokenFile::~TokenFile() {
  if (map_) munmap(map_, map_size_);
  if (fd_ >= 0) ::close(fd_);
}

void TokenFile::copy(int64_t begin, int64_t n, int32_t* out) const {
  ZP_CHECK(begin >= 0 && n >= 0 && begin + n <= n_tokens_, path_, ": tokens [", begin, ", ", begin + n, ") of ", n_tokens_);
  for (int64_t i = 0; i < n; ++i) out[i] = at(begin + i);
}

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int32_t vocab_size) {
  int32_t h[256] = {0};
  bool small = true;
  for (int32_t t : tokens) {
    ZP_REQUIRE(t >= 0, path, ": negative token id ", t);
    if (t > 65535) small = false;
  }
  h[0] = kTokenFileMagic;
  h[1] = 1;
  h[2] = small ? 2 : 4;
  h[3] = int32_t(uint32_t(uint64_t(tokens.size()) & 0xffffffffu));
  h[4] = int32_t(uint32_t(uint64_t(tokens.size()) >> 32));
  h[5] = vocab_size;
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  ZP_REQUIRE(f, tmp, ": cannot create: ", std::strerror(errno));
  bool ok = std::fwrite(h, sizeof(h), 1, f) == 1;
  if (small) {
    std::vector<uint16_t> v(tokens.begin(), tokens.end());
    ok = ok && std::fwrite(v.data(), 2, v.size(), f) == v.size();
  } else {
    ok = ok && std::fwrite(tokens.data(), 4, tokens.size(), f) == tokens.size();
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    throw Error(path + ": write failed");
  }
  ZP_REQUIRE(std::rename(tmp.c_str(), path.c_str()) == 0, path, ": rename failed: ", std::strerror(errno));
}

TokenDataset::TokenDataset(const std::vector<std::string>& paths, int64_t seq_len, double from, double to)
    : T_(seq_len) {
  ZP_REQUIRE(seq_len >= 1, "sequence length must be positive, got ", seq_len);
  ZP_REQUIRE(!paths.empty(), "no token files given");
  ZP_REQUIRE(0.0 <= from && from < to && to <= 1.0, "window range [", from, ", ", to, ") is not inside [0, 1]");
  std::vector<Window> all;
  for (const auto& p : paths) {
    files_.push_back(std::make_unique<TokenFile>(p));
    const TokenFile& f = *files_.back();
    for (int64_t s = 0; s + T_ + 1 <= f.size(); s += T_) all.push_back({uint32_t(files_.size() - 1), s});
  }
  ZP_REQUIRE(!all.empty(), paths[0], (paths.size() > 1 ? " (and the other shards)" : ""),
             ": too few tokens for one window of ", T_ + 1);
  size_t b = size_t(from * double(all.size())), e = size_t(to * double(all.size()));
  ZP_REQUIRE(e > b, "the selected fraction [", from, ", ", to, ") of ", all.size(), " windows is empty");
  windows_.assign(all.begin() + int64_t(b), all.begin() + int64_t(e));
}

void TokenDataset::window(int64_t w, int32_t* inputs, int32_t* targets) const {
  ZP_CHECK(w >= 0 && w < num_windows(), "window ", w, " of ", num_windows());
  const Window& win = windows_[size_t(w)];
  const TokenFile& f = *files_[win.file];
  f.copy(win.start, T_, inputs);
  f.copy(win.start + 1, T_, targets);
}

int64_t TokenDataset::epoch_order(uint64_t seed, int64_t epoch, int64_t i, bool shuffle) const {
  ZP_CHECK(i >= 0 && i < num_windows(), "position ", i, " of ", num_windows());
  if (!shuffle) return i;
  if (cached_epoch_ != epoch || cached_seed_ != seed) {
    order_.resize(windows_.size());
    std::iota(order_.begin(), order_.end(), 0);
    // Fisher-Yates with our own draws: std::shuffle's algorithm is not fixed by the standard.
    std::mt19937_64 g(seed * 0x9E3779B97F4A7C15ull + uint64_t(epoch));
    for (size_t k = order_.size(); k > 1; --k) std::swap(order_[k - 1], order_[size_t(g() % k)]);
    cached_epoch_ = epoch;
    cached_seed_ = seed;
  }
  return order_[size_t(i)];
}

int32_t TokenDataset::max_token_seen_bound() const {
  int32_t v = 0;
  for (auto& f : files_) v = std::max(v, f->vocab_size());
  return v;
}

}  // namespace zp::io
