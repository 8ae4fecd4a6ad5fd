// Byte-level BPE tokenizer (GPT-2, Llama 3, Qwen2): text -> token ids and back, byte for byte.
//
// Encoding: added tokens (special ones such as <|endoftext|> and others a model's authors added) are
// found in the text first, leftmost and at one place the longest, as Hugging Face's tokenizers does;
// the text between them is cut into pieces by the split patterns (io/split_pattern.h), each applied
// to the pieces of the one before; each piece's bytes are then merged pairwise by the merges' ranks,
// lowest first and leftmost among equals. Decoding concatenates the tokens' bytes: text that was not
// valid UTF-8 comes back as the same bytes (Hugging Face's decode would put U+FFFD in their place).
//
// Files: io/tokenizer_files.h reads tokenizer.json, vocab.json + merges.txt and tokenizer_config.json
// into the parts below.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "io/split_pattern.h"

namespace zp::io {

struct AddedToken {
  std::string content;  // the text it is matched as (UTF-8, not in the byte-level alphabet)
  int32_t id = 0;
  bool special = false;  // special tokens can be left out of decoding and treated as text when encoding
};

// What a tokenizer is made of, however it was stored. Tokens and merges are in the byte-level
// alphabet (io/byte_level_alphabet.h), as the files hold them.
struct BpeTokenizerParts {
  std::string source;  // the file(s) it came from: every error about the parts names it
  std::vector<std::pair<std::string, int32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  std::vector<AddedToken> added_tokens;
  std::vector<SplitPattern> split_patterns;
  // A piece that is itself a token is that token, without merging (Llama 3's ignore_merges; tiktoken
  // works this way). Merging can reach a different segmentation for a few such pieces.
  bool ignore_merges = false;
  std::optional<std::string> bos_token, eos_token;  // token names (tokenizer_config.json)
  // What encode(add_special) puts around the text: the post-processor's template, unless the
  // config's add_bos_token / add_eos_token say otherwise.
  std::vector<int32_t> template_prefix, template_suffix;
  std::optional<bool> add_bos_token, add_eos_token;
};

struct EncodeOptions {
  // Put the tokenizer's own tokens around the text (BOS for Llama 3; nothing for GPT-2), as
  // Hugging Face's add_special_tokens=True does.
  bool add_special = false;
  // Special tokens written in the text are ordinary text (Hugging Face's split_special_tokens).
  bool split_special = false;
};

class BpeTokenizer {
 public:
  // Throws zp::Error naming parts.source for inconsistent parts: a merge naming a token that is not
  // in the vocabulary, or whose result is not; two tokens with one id; a bos/eos name that is no token.
  explicit BpeTokenizer(BpeTokenizerParts parts);

  // `text` may hold any bytes. Safe to call from several threads at once.
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options = {}) const;
  // The same, appended to `out` (a long text's ids go straight to their place).
  void encode(std::string_view text, const EncodeOptions& options, std::vector<int32_t>& out) const;
  // The bytes of the tokens; an id outside the vocabulary is a zp::Error naming it and its position.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // Token names are the files' spelling ("Ġthe" for " the"; added tokens as they are).
  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string& id_to_token(int32_t id) const;  // zp::Error for an id that is no token
  // The bytes token `id` decodes to (zp::Error for an id that is no token): where a token's text
  // starts and ends in what was encoded, since decoding gives back the encoded bytes exactly.
  const std::string& token_bytes(int32_t id) const;
  // One more than the largest id (vocabulary and added tokens); a model's embedding needs at least
  // this many rows.
  int32_t vocab_size() const { return int32_t(names_.size()); }
  std::optional<int32_t> bos_id() const { return bos_; }
  std::optional<int32_t> eos_id() const { return eos_; }
  // Whether encode(add_special) starts the text with BOS.
  bool adds_bos() const { return bos_ && !prefix_.empty() && prefix_.front() == *bos_; }
  bool is_special(int32_t id) const { return id >= 0 && size_t(id) < special_.size() && special_[size_t(id)]; }
  const std::string& source() const { return source_; }

 private:
  struct Merge { int32_t rank; int32_t id; };
  // Splits `text` by patterns_[level...] and encodes the pieces.
  void encode_text(std::string_view text, size_t level, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_piece(std::string_view piece, std::vector<int32_t>& out) const;
  [[noreturn]] void no_byte_token(uint8_t b) const;

  std::string source_;
  std::vector<std::string> names_;  // by id; empty where no token has the id
  std::vector<std::string> bytes_;  // by id
  std::vector<bool> special_;
  // Looked up by string_view without building a string (C++20 heterogeneous lookup).
  struct Hash : std::hash<std::string_view> {
    using is_transparent = void;
  };
  template <class V> using StringMap = std::unordered_map<std::string, V, Hash, std::equal_to<>>;
  StringMap<int32_t> by_name_;
  StringMap<int32_t> by_bytes_;  // the vocabulary proper, not the added tokens
  std::array<int32_t, 256> byte_token_{};  // the token of each single byte, -1 when there is none
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> rank and result
  std::vector<AddedToken> added_;
  std::array<std::vector<uint32_t>, 256> added_by_first_byte_;  // indices into added_, longest first
  std::vector<SplitPattern> patterns_;
  bool ignore_merges_ = false;
  std::vector<int32_t> prefix_, suffix_;
  std::optional<int32_t> bos_, eos_;
  // Pieces repeat (" the", " of"): their merged ids are kept in a direct-mapped table, one slot per
  // hash, a newer piece replacing an older one. One memory access per lookup and no allocation: a
  // node-based map spent a fifth of the encoding time on its own lookups. Pieces too long for a slot
  // are merged every time (they are rare). Behind a pointer so that the tokenizer can be moved.
  struct CacheSlot {
    uint64_t hash = 0;
    uint8_t length = 0;  // of the piece; 0: empty
    uint8_t count = 0;   // of ids
    char piece[22];
    int32_t ids[8];
  };
  static constexpr size_t kCacheSlots = size_t(1) << 16;
  struct PieceCache {
    std::mutex mutex;
    std::vector<CacheSlot> slots = std::vector<CacheSlot>(kCacheSlots);
  };
  std::unique_ptr<PieceCache> cache_ = std::make_unique<PieceCache>();
};

}  // namespace zp::io
