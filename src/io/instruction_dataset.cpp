#include "io/instruction_dataset.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace zp::io {

InstructionDataset::InstructionDataset(const std::vector<std::string>& paths, const InstructionRowsOptions& options) {
  ZP_REQUIRE(!paths.empty(), "no instruction token files given");
  for (const std::string& p : paths) {
    Source s;
    s.name = p;
    s.file = std::make_unique<InstructionFile>(p);
    if (sources_.empty()) {
      template_ = s.file->chat_template();
      pad_ = s.file->pad_id();
    }
    ZP_REQUIRE(s.file->chat_template() == template_, p, ": records in the ", chat_template_name(s.file->chat_template()),
               " chat template, but ", paths[0], "'s are in ", chat_template_name(template_),
               " (one run trains on one format)");
    declared_vocab_ = std::max(declared_vocab_, s.file->vocab_size());
    for (int64_t r = 0; r < s.file->records(); ++r)
      records_.push_back({uint32_t(sources_.size()), s.file->record_start(r), s.file->record_start(r + 1)});
    sources_.push_back(std::move(s));
  }
  select_and_lay_out(options);
}

InstructionDataset::InstructionDataset(const std::vector<std::string>& jsonl_paths, const ChatFormatter& formatter,
                                       const InstructionRowsOptions& options) {
  ZP_REQUIRE(!jsonl_paths.empty(), "no JSONL files given");
  template_ = formatter.chat_template();
  pad_ = formatter.pad_id();
  declared_vocab_ = formatter.tokenizer().vocab_size();
  for (const std::string& p : jsonl_paths) {
    Source s;
    s.name = p;
    s.tokens = tokenize_instruction_jsonl(p, formatter);
    for (int64_t r = 0; r < s.tokens.records(); ++r)
      records_.push_back({uint32_t(sources_.size()), s.tokens.record_starts[size_t(r)], s.tokens.record_starts[size_t(r) + 1]});
    sources_.push_back(std::move(s));
  }
  select_and_lay_out(options);
}

InstructionDataset::~InstructionDataset() = default;

int64_t InstructionDataset::kept(const Record& rec) const {
  // Unpacked, the token after the row's last input is still its target; packed, a record's last
  // token in the row predicts nothing, so the row holds T of them.
  return std::min(rec.end - rec.begin, packing_ ? T_ : T_ + 1);
}

void InstructionDataset::select_and_lay_out(const InstructionRowsOptions& o) {
  ZP_REQUIRE(o.seq_len >= 1, "sequence length must be positive, got ", o.seq_len);
  ZP_REQUIRE(0.0 <= o.from && o.from < o.to && o.to <= 1.0, "record range [", o.from, ", ", o.to,
             ") is not inside [0, 1]");
  T_ = o.seq_len;
  packing_ = o.packing;
  const size_t b = size_t(o.from * double(records_.size())), e = size_t(o.to * double(records_.size()));
  ZP_REQUIRE(e > b, "the selected fraction [", o.from, ", ", o.to, ") of ", records_.size(), " records in ",
             sources_.front().name, (sources_.size() > 1 ? " (and the other files)" : ""), " is empty");
  records_ = std::vector<Record>(records_.begin() + int64_t(b), records_.begin() + int64_t(e));

  for (const Record& rec : records_) {
    const int64_t keep = kept(rec);
    if (keep == rec.end - rec.begin) continue;
    ++truncated_;
    bool trained = false;
    for (int64_t i = rec.begin + 1; i < rec.begin + keep && !trained; ++i) trained = sources_[rec.source].loss(i);
    untrained_ += !trained;
  }

  const int64_t n = int64_t(records_.size());
  if (packing_ && o.packing_seed) {
    epoch_permutation(*o.packing_seed, 0, n, pack_order_);
  } else {
    pack_order_.resize(size_t(n));
    std::iota(pack_order_.begin(), pack_order_.end(), 0);
  }
  if (!packing_) {
    for (int64_t r = 0; r < n; ++r) rows_.push_back({r, 1});
  } else {
    int64_t fill = 0;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t len = kept(records_[size_t(pack_order_[size_t(k)])]);
      if (rows_.empty() || fill + len > T_) {
        rows_.push_back({k, 0});
        fill = 0;
      }
      ++rows_.back().count;
      fill += len;
    }
  }
  // Every row's tokens and trained targets, once: each step counts those of its whole global batch.
  for (Row& row : rows_)
    for (int32_t j = 0; j < row.count; ++j) {
      const Record& rec = records_[size_t(pack_order_[size_t(row.first + j)])];
      const int64_t keep = kept(rec), inputs = std::min(keep, T_);
      row.tokens += int32_t(inputs);
      for (int64_t i = 0; i < inputs; ++i) row.trained += has_target(rec, i, keep);
    }
}

void InstructionDataset::row(int64_t r, const InstructionRowView& out) const {
  ZP_CHECK(r >= 0 && r < num_rows(), "row ", r, " of ", num_rows());
  std::fill(out.ids, out.ids + T_, pad_);
  std::fill(out.targets, out.targets + T_, -1);
  std::fill(out.segments, out.segments + T_, -1);
  std::fill(out.positions, out.positions + T_, 0);
  const Row& row = rows_[size_t(r)];
  int64_t at = 0;
  for (int32_t j = 0; j < row.count; ++j) {
    const Record& rec = records_[size_t(pack_order_[size_t(row.first + j)])];
    const Source& src = sources_[rec.source];
    const int64_t keep = kept(rec), inputs = std::min(keep, T_);
    ZP_CHECK(at + inputs <= T_, "row ", r, " overflows: ", at, " + ", inputs, " tokens in ", T_);
    for (int64_t i = 0; i < inputs; ++i) {
      const int64_t t = rec.begin + i;
      out.ids[at + i] = src.id(t);
      out.targets[at + i] = has_target(rec, i, keep) ? src.id(t + 1) : -1;
      out.segments[at + i] = j;
      out.positions[at + i] = int32_t(i);
    }
    at += inputs;
  }
}

void InstructionDataset::check_vocab(int64_t vocab) const {
  ZP_REQUIRE(vocab > 0, "cannot check token ids against a vocabulary of ", vocab);
  for (const Source& s : sources_) {
    const int64_t n = s.file ? s.file->tokens() : int64_t(s.tokens.ids.size());
    for (int64_t i = 0; i < n; ++i)
      ZP_REQUIRE(s.id(i) < vocab, s.name, ": token ", i, " has id ", s.id(i), ", outside the model's vocabulary of ",
                 vocab, " (the first such token; the data was made with another tokenizer)");
  }
  ZP_REQUIRE(pad_ < vocab, sources_.front().name, ": the pad id ", pad_, " is outside the model's vocabulary of ", vocab);
}

}  // namespace zp::io
