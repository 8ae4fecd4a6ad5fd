// Instruction data as rows of T tokens for supervised fine-tuning (issue 14): records from
// instruction token files (io/instruction_file.h) or from JSONL tokenised at start-up through the
// same formatter (io/chat_format.h), served as
//
//   ids[T]        the tokens; padding is the pad id
//   targets[T]    the next token where the loss trains on it, else -1 (a prompt, a record's last
//                 token, padding): the LM loss ignores targets < 0
//   segments[T]   the record's index within the row, 0, 1, 2, ...; padding -1
//   positions[T]  the token's position within its record (restarting at 0); padding 0
//
// Without packing a row is one record, cut to T + 1 tokens (its first T are inputs, the last is
// only a target) and padded. With packing, records are laid into rows greedily (each into the
// current row when it fits, else into a new one) in a fixed order, never split across rows; a record
// longer than T is cut to T tokens, and a target never crosses from one record into the next. The
// rows, and how many there are, depend only on (files, T, packing, packing order): a seeded packing
// order is drawn once (epoch_permutation(seed, epoch 0)), not per epoch, so every epoch has the same
// rows. An epoch visits the rows in a seeded order (epoch_order) that depends only on (seed, epoch),
// never on the world size, so every rank takes its share of a global batch by position, as with
// token files.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/chat_format.h"
#include "io/epoch_order.h"
#include "io/instruction_file.h"

namespace zp::io {

struct InstructionRowsOptions {
  int64_t seq_len = 1024;  // T
  bool packing = false;
  // The order records are packed in: epoch_permutation(seed, 0, records); none: file order.
  std::optional<uint64_t> packing_seed;
  // The selected fraction of all records (file order, the files one after the other): e.g.
  // [0, 0.9) for training and [0.9, 1) for validation.
  double from = 0.0, to = 1.0;
};

// Where row() writes: four host arrays of seq_len() int32 each.
struct InstructionRowView {
  int32_t* ids;
  int32_t* targets;
  int32_t* segments;
  int32_t* positions;
};

class InstructionDataset {
 public:
  // Instruction token files. All must have one chat template; the first's pad id pads.
  InstructionDataset(const std::vector<std::string>& paths, const InstructionRowsOptions& options);
  // JSONL files, tokenised now through `formatter` (tokenize_instruction_jsonl).
  InstructionDataset(const std::vector<std::string>& jsonl_paths, const ChatFormatter& formatter,
                     const InstructionRowsOptions& options);
  ~InstructionDataset();

  int64_t seq_len() const { return T_; }
  bool packing() const { return packing_; }
  int64_t num_rows() const { return int64_t(rows_.size()); }
  int64_t num_records() const { return int64_t(records_.size()); }  // of the selected fraction
  // Records longer than a row holds, cut; and those of them left with no trained token.
  int64_t truncated_records() const { return truncated_; }
  int64_t untrained_records() const { return untrained_; }
  int32_t pad_id() const { return pad_; }
  ChatTemplate chat_template() const { return template_; }
  // The largest vocabulary a file declares (0 if none; a tokenizer's size for JSONL).
  int32_t declared_vocab() const { return declared_vocab_; }
  // Throws zp::Error naming the file (or JSONL) and the first id >= `vocab` (the model's), so a bad
  // id stops the run before it starts rather than when its row is drawn.
  void check_vocab(int64_t vocab) const;

  // Row `r` (0 <= r < num_rows) into `out`.
  void row(int64_t r, const InstructionRowView& out) const;
  // How many of row `r`'s targets are trained (>= 0), without assembling the row: a step's loss
  // averages over the trained targets of all its rows, counted before any of them is read.
  int64_t trained_targets(int64_t r) const { return rows_.at(size_t(r)).trained; }
  // How many of row `r`'s tokens are records' (not padding): what throughput counts.
  int64_t tokens(int64_t r) const { return rows_.at(size_t(r)).tokens; }
  // The row at position `i` of epoch `epoch`'s order (shuffle=false: identity).
  int64_t epoch_order(uint64_t seed, int64_t epoch, int64_t i, bool shuffle = true) const {
    return order_.at(seed, epoch, num_rows(), i, shuffle);
  }

 private:
  // The records of one file, mapped or tokenised in memory.
  struct Source {
    std::string name;
    std::unique_ptr<InstructionFile> file;
    InstructionTokens tokens;
    int32_t id(int64_t i) const { return file ? file->id(i) : tokens.ids[size_t(i)]; }
    bool loss(int64_t i) const { return file ? file->loss(i) : tokens.loss[size_t(i)] != 0; }
  };
  struct Record {
    uint32_t source;
    int64_t begin, end;  // tokens of the source
  };
  struct Row {
    int64_t first;   // into pack_order_
    int32_t count;   // records
    int32_t tokens = 0, trained = 0;  // not padding; with a trained target
  };
  void select_and_lay_out(const InstructionRowsOptions& options);
  // How many of record `rec`'s tokens a row holds.
  int64_t kept(const Record& rec) const;
  // Whether input `i` (< kept(rec)) of record `rec` has a target: the next token, kept and trained.
  bool has_target(const Record& rec, int64_t i, int64_t keep) const {
    return i + 1 < keep && sources_[rec.source].loss(rec.begin + i + 1);
  }

  std::vector<Source> sources_;
  std::vector<Record> records_;        // the selected fraction, file order
  std::vector<int64_t> pack_order_;    // indices into records_, in the order rows take them
  std::vector<Row> rows_;
  int64_t T_ = 0;
  bool packing_ = false;
  int64_t truncated_ = 0, untrained_ = 0;
  int32_t pad_ = 0, declared_vocab_ = 0;
  ChatTemplate template_ = ChatTemplate::Plain;
  mutable EpochOrder order_;
};

}  // namespace zp::io
