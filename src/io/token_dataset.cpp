#include "io/token_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "io/atomic_file.h"

namespace zp::io {

namespace {
constexpr size_t kHeaderBytes = 256 * sizeof(int32_t);
}  // namespace

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
  constexpr size_t kHeader = kHeaderBytes;
  if (map_size_ < kHeader) fail("shorter than the 1024-byte header");
  map_ = mmap(nullptr, map_size_, PROT_READ, MAP_SHARED, fd_, 0);
  if (map_ == MAP_FAILED) { map_ = nullptr; fail(std::string("mmap: ") + std::strerror(errno)); }
  const auto* h = static_cast<const int32_t*>(map_);
  uint64_t claimed = 0;
  if (h[0] == kTokenFileMagic) {
    if (h[1] != 1) fail("unsupported version " + std::to_string(h[1]));
    if (h[2] != 2 && h[2] != 4) fail("bytes per token must be 2 or 4, header says " + std::to_string(h[2]));
    token_bytes_ = h[2];
    claimed = uint64_t(uint32_t(h[3])) | (uint64_t(uint32_t(h[4])) << 32);
    if (h[5] < 0) fail("the header's vocabulary size " + std::to_string(h[5]) + " is negative (0 means unknown)");
    vocab_ = h[5];
  } else if (h[0] == kLlmcTokenMagic) {
    if (h[1] != 1) fail("unsupported llm.c version " + std::to_string(h[1]));
    token_bytes_ = 2;
    claimed = uint64_t(uint32_t(h[2]));
  } else {
    fail("unknown magic " + std::to_string(h[0]));
  }
  // Divided rather than multiplied: a hostile count times the token size can wrap around to exactly
  // the file's size.
  const uint64_t data_bytes = map_size_ - kHeader;
  if (data_bytes % uint64_t(token_bytes_) != 0 || claimed != data_bytes / uint64_t(token_bytes_))
    fail("header says " + std::to_string(claimed) + " tokens of " + std::to_string(token_bytes_) +
         " bytes but the file holds " + std::to_string(data_bytes) + " bytes after the " + std::to_string(kHeader) +
         "-byte header");
  n_tokens_ = int64_t(claimed);  // at most the file size over 2, so it fits
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

namespace {

// The largest of p[0, n): a branch-free reduction without an early exit, which the compiler turns
// into packed unsigned max instructions.
template <class T> T max_of(const T* p, size_t n) {
  T m = 0;
  for (size_t i = 0; i < n; ++i) m = p[i] > m ? p[i] : m;
  return m;
}

template <class T> int64_t first_at_least(const T* p, size_t n, uint64_t bound) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] >= bound) return int64_t(i);
  return -1;
}

}  // namespace

void TokenFile::check_vocab(int64_t vocab) const {
  ZP_REQUIRE(vocab > 0, path_, ": cannot check token ids against a vocabulary of ", vocab);
  // A file that declares a smaller vocabulary than the model's holds no ids beyond its own: one that
  // does is damaged even when the model could embed it.
  const bool file_bound = vocab_ > 0 && vocab_ < vocab;
  const uint64_t bound = uint64_t(file_bound ? vocab_ : vocab);
  // Compared as unsigned: a 4-byte id of 2^31 or more would turn negative as an int32.
  if (token_bytes_ == 2 && bound > 65535) return;  // every 2-byte id fits
  madvise(map_, map_size_, MADV_SEQUENTIAL);
  // Blocks keep the hot loop a pure reduction; only a block holding a bad id is searched again.
  constexpr size_t kBlock = size_t(1) << 16;
  const size_t n = size_t(n_tokens_);
  int64_t bad = -1;
  for (size_t b = 0; b < n && bad < 0; b += kBlock) {
    const size_t len = std::min(kBlock, n - b);
    if (token_bytes_ == 2) {
      const auto* p = static_cast<const uint16_t*>(tokens_) + b;
      if (max_of(p, len) >= bound) bad = int64_t(b) + first_at_least(p, len, bound);
    } else {
      const auto* p = static_cast<const uint32_t*>(tokens_) + b;
      if (max_of(p, len) >= bound) bad = int64_t(b) + first_at_least(p, len, bound);
    }
  }
  madvise(map_, map_size_, MADV_RANDOM);
  if (bad < 0) return;
  const uint32_t id = token_bytes_ == 2 ? static_cast<const uint16_t*>(tokens_)[bad]
                                        : static_cast<const uint32_t*>(tokens_)[bad];
  throw Error(path_ + ": token " + std::to_string(bad) + " (byte " + std::to_string(int64_t(kHeaderBytes) + bad * token_bytes_) +
              ") has id " + std::to_string(id) + ", outside " +
              (file_bound ? "the vocabulary of " + std::to_string(vocab_) + " that the file's header declares"
                          : "the model's vocabulary of " + std::to_string(vocab)) +
              " (the first such token; the file is damaged or was made with another tokenizer)");
}

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int32_t vocab_size) {
  ZP_REQUIRE(vocab_size >= 0, path, ": vocabulary size ", vocab_size, " is negative (0 means unknown)");
  int32_t h[256] = {0};
  bool small = true;
  for (int32_t t : tokens) {
    ZP_REQUIRE(t >= 0, path, ": negative token id ", t);
    // A file whose ids exceed its own vocabulary would be rejected when read.
    ZP_REQUIRE(vocab_size == 0 || t < vocab_size, path, ": token id ", t, " is outside the vocabulary of ", vocab_size);
    if (t > 65535) small = false;
  }
  h[0] = kTokenFileMagic;
  h[1] = 1;
  h[2] = small ? 2 : 4;
  h[3] = int32_t(uint32_t(uint64_t(tokens.size()) & 0xffffffffu));
  h[4] = int32_t(uint32_t(uint64_t(tokens.size()) >> 32));
  h[5] = vocab_size;
  AtomicFile f(path, FileSync::None);
  f.write(h, sizeof(h));
  if (small) {
    std::vector<uint16_t> v(tokens.begin(), tokens.end());
    f.write(v.data(), v.size() * 2);
  } else {
    f.write(tokens.data(), tokens.size() * 4);
  }
  f.commit();
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
  return order_.at(seed, epoch, num_windows(), i, shuffle);
}

void TokenDataset::check_vocab(int64_t vocab) const {
  for (const auto& f : files_) f->check_vocab(vocab);
}

int32_t TokenDataset::max_token_seen_bound() const {
  int32_t v = 0;
  for (auto& f : files_) v = std::max(v, f->vocab_size());
  return v;
}

}  // namespace zp::io
