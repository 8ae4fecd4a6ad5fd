// Token files, memory-mapped. Two layouts, both a 256 x int32 header followed by the tokens:
//  - ours:   header[0] = 0x5A50544B ("ZPTK"), [1] = version 1, [2] = bytes per token (2 or 4),
//            [3..4] = token count (low, high 32 bits), [5] = vocabulary size (0 = unknown, negative is
//            an error);
//  - llm.c:  header[0] = 20240520, [1] = version 1, [2] = token count; tokens are uint16.
// A TokenDataset serves windows of T+1 consecutive tokens (inputs and shifted targets). The windows
// of a file are cut at stride T; an epoch visits them in a seeded random order, and the order depends
// only on (seed, epoch), never on the world size, so every rank can compute its share of a global batch.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/epoch_order.h"

namespace zp::io {

constexpr int32_t kTokenFileMagic = 0x5A50544B;
constexpr int32_t kLlmcTokenMagic = 20240520;

class TokenFile {
 public:
  explicit TokenFile(const std::string& path);  // throws zp::Error naming the file on a bad header
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  const std::string& path() const { return path_; }
  int64_t size() const { return n_tokens_; }
  int token_bytes() const { return token_bytes_; }
  int32_t vocab_size() const { return vocab_; }  // 0 when the file does not say
  int32_t at(int64_t i) const {
    return token_bytes_ == 2 ? int32_t(static_cast<const uint16_t*>(tokens_)[i])
                             : int32_t(static_cast<const uint32_t*>(tokens_)[i]);
  }
  // Copies tokens [begin, begin+n) into out as int32.
  void copy(int64_t begin, int64_t n, int32_t* out) const;
  // Reads every token once and throws zp::Error naming the file, the first position and the id of a
  // token >= `vocab` (the model's vocabulary) or >= the vocabulary the header declares. A bad id
  // would otherwise abort the run in the embedding only when its window is first drawn, hours in.
  void check_vocab(int64_t vocab) const;

 private:
  std::string path_;
  int fd_ = -1;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const void* tokens_ = nullptr;
  int64_t n_tokens_ = 0;
  int token_bytes_ = 2;
  int32_t vocab_ = 0;
};

// Writes `tokens` in our layout (2 bytes per token when every id fits, else 4).
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int32_t vocab_size);

class TokenDataset {
 public:
  // `paths`: one or more token files (shards), concatenated window-wise (no window spans two files).
  // [from, to) selects a fraction of all windows: e.g. [0, 0.9) for training and [0.9, 1) for validation.
  TokenDataset(const std::vector<std::string>& paths, int64_t seq_len, double from = 0.0, double to = 1.0);
  int64_t seq_len() const { return T_; }
  int64_t num_windows() const { return int64_t(windows_.size()); }
  // Window `w` (0 <= w < num_windows) -> inputs[T] and targets[T] (targets = inputs shifted by one).
  void window(int64_t w, int32_t* inputs, int32_t* targets) const;
  // The window index at position `i` of epoch `epoch`'s shuffled order (shuffle=false: identity).
  int64_t epoch_order(uint64_t seed, int64_t epoch, int64_t i, bool shuffle = true) const;
  int32_t max_token_seen_bound() const;  // the largest vocab_size the files declare (0 if none)
  // TokenFile::check_vocab for every file: a full read of the data, meant to be called once per run
  // before training starts (memory-bandwidth bound: 100M tokens take about 0.1 s once mapped).
  void check_vocab(int64_t vocab) const;

 private:
  struct Window { uint32_t file; int64_t start; };
  std::vector<std::unique_ptr<TokenFile>> files_;
  std::vector<Window> windows_;
  int64_t T_;
  mutable EpochOrder order_;
};

}  // namespace zp::io
