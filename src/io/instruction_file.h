// Instruction records, tokenised (io/chat_format.h), and the file that keeps them ("instruction token
// file", written by `zeropipe tokenize --format instruct`, read by data.format "instruct").
//
// Layout, little-endian, like io/token_dataset.h's ZPTK files: a 256 x int32 header, then three arrays.
//   header[0] = 0x5A50494E ("ZPIN"), [1] = version 1, [2] = bytes per token (2 or 4),
//   [3..4] = token count N (low, high 32 bits), [5..6] = record count R (low, high),
//   [7] = vocabulary size (0 = unknown), [8] = pad id, [9] = chat template (0 plain, 1 llama3, 2 chatml),
//   the rest 0.
//   int64  record_starts[R + 1]   record r is tokens [record_starts[r], record_starts[r + 1]);
//                                 0 first, N last, each record at least 2 tokens
//   uintX  tokens[N]              2 or 4 bytes each
//   uint8  loss[N]                1: the model learns to produce this token; else 0
// The record starts come first so that every array is aligned where the file is mapped.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/chat_format.h"

namespace zp::io {

constexpr int32_t kInstructionFileMagic = 0x5A50494E;

// Records one after the other, as a file holds them.
struct InstructionTokens {
  std::vector<int32_t> ids;
  std::vector<uint8_t> loss;                   // one per id
  std::vector<int64_t> record_starts = {0};    // R + 1 entries
  int64_t records() const { return int64_t(record_starts.size()) - 1; }
};

// Every record of a JSONL file (blank lines skipped) through `formatter`, in file order. Throws
// zp::Error naming FILE:LINE for a line that is not JSON or not a valid record
// (parse_chat_record), and naming the file when it holds no record.
InstructionTokens tokenize_instruction_jsonl(const std::string& path, const ChatFormatter& formatter);

// Writes `data` in the layout above, atomically (io/atomic_file.h). Throws zp::Error naming the file
// for ids outside [0, vocab_size) (vocab_size 0: unchecked), a record shorter than 2 tokens, or
// inconsistent arrays.
void write_instruction_file(const std::string& path, const InstructionTokens& data, int32_t vocab_size,
                            int32_t pad_id, ChatTemplate chat_template);

// A file in the layout above, memory-mapped (ranks of one node share its pages) and checked whole
// when opened: a bad header, sizes that disagree with the file's length, record starts that do not
// rise from 0 to N by at least 2, a loss flag other than 0 or 1, or an id at or past the declared
// vocabulary are a zp::Error naming the file and what is wrong.
class InstructionFile {
 public:
  explicit InstructionFile(const std::string& path);
  ~InstructionFile();
  InstructionFile(const InstructionFile&) = delete;
  InstructionFile& operator=(const InstructionFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t tokens() const { return n_tokens_; }
  int64_t records() const { return n_records_; }
  int32_t vocab_size() const { return vocab_; }
  int32_t pad_id() const { return pad_; }
  ChatTemplate chat_template() const { return template_; }
  int64_t record_start(int64_t r) const { return starts_[r]; }  // r in [0, records()]
  int32_t id(int64_t i) const {
    return token_bytes_ == 2 ? int32_t(static_cast<const uint16_t*>(ids_)[i]) : int32_t(static_cast<const uint32_t*>(ids_)[i]);
  }
  bool loss(int64_t i) const { return loss_[i] != 0; }
  // All of it as InstructionTokens (tests, and tools that rewrite files).
  InstructionTokens read_all() const;

 private:
  std::string path_;
  int fd_ = -1;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const int64_t* starts_ = nullptr;
  const void* ids_ = nullptr;
  const uint8_t* loss_ = nullptr;
  int64_t n_tokens_ = 0, n_records_ = 0;
  int token_bytes_ = 2;
  int32_t vocab_ = 0, pad_ = 0;
  ChatTemplate template_ = ChatTemplate::Plain;
};

}  // namespace zp::io
