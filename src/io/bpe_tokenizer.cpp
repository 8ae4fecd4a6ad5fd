#include "io/bpe_tokenizer.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "core/error.h"
#include "io/bounded_json.h"
#include "io/byte_level_alphabet.h"

namespace zp::io {

namespace {

uint64_t pair_key(int32_t left, int32_t right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }

std::string in_quotes(std::string_view s) {
  std::string r = "'";  // appended rather than "'" + ... + "'", which GCC 12 misreads as overlapping (-Wrestrict)
  r += text_excerpt(s, 60);
  r += '\'';
  return r;
}

}  // namespace

BpeTokenizer::BpeTokenizer(BpeTokenizerParts parts)
    : source_(std::move(parts.source)), added_(std::move(parts.added_tokens)), patterns_(std::move(parts.split_patterns)),
      ignore_merges_(parts.ignore_merges) {
  const ByteLevelAlphabet& alphabet = byte_level_alphabet();
  auto place = [&](int32_t id, const std::string& name, std::string bytes, bool special) {
    ZP_REQUIRE(id >= 0, source_, ": token ", in_quotes(name), " has the negative id ", id);
    if (size_t(id) >= names_.size()) {
      names_.resize(size_t(id) + 1);
      bytes_.resize(size_t(id) + 1);
      special_.resize(size_t(id) + 1);
    }
    auto& slot = names_[size_t(id)];
    // An added token may repeat a vocabulary entry (GPT-2's <|endoftext|> is in both).
    ZP_REQUIRE(slot.empty() || slot == name, source_, ": tokens ", in_quotes(slot), " and ", in_quotes(name),
               " both have id ", id);
    slot = name;
    bytes_[size_t(id)] = std::move(bytes);
    special_[size_t(id)] = special;
    by_name_[name] = id;
  };
  by_bytes_.reserve(parts.vocab.size());
  for (auto& [name, id] : parts.vocab) {
    std::string bytes;
    ZP_REQUIRE(alphabet.decode(name, bytes), source_, ": vocabulary entry ", id, " is not valid UTF-8");
    by_bytes_.emplace(bytes, id);
    place(id, name, std::move(bytes), false);
  }
  byte_token_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    auto it = by_bytes_.find(std::string(1, char(b)));
    if (it != by_bytes_.end()) byte_token_[size_t(b)] = it->second;
  }

  merges_.reserve(parts.merges.size());
  for (size_t rank = 0; rank < parts.merges.size(); ++rank) {
    const auto& [left, right] = parts.merges[rank];
    auto id_of = [&](const std::string& name) {
      auto it = by_name_.find(name);
      ZP_REQUIRE(it != by_name_.end(), source_, ": merge ", rank, " (", in_quotes(left + " " + right), ") names ",
                 in_quotes(name), ", which is not in the vocabulary");
      return it->second;
    };
    const int32_t l = id_of(left), r = id_of(right);
    auto merged = by_name_.find(left + right);
    ZP_REQUIRE(merged != by_name_.end(), source_, ": merge ", rank, " (", in_quotes(left + " " + right),
               ") makes ", in_quotes(left + right), ", which is not in the vocabulary");
    // A pair listed twice keeps its first (lowest) rank, as Hugging Face's loader does.
    merges_.emplace(pair_key(l, r), Merge{int32_t(rank), merged->second});
  }

  for (uint32_t i = 0; i < added_.size(); ++i) {
    const AddedToken& t = added_[i];
    ZP_REQUIRE(!t.content.empty(), source_, ": added token ", t.id, " is empty");
    place(t.id, t.content, t.content, t.special);
    added_by_first_byte_[uint8_t(t.content[0])].push_back(i);
  }
  for (auto& candidates : added_by_first_byte_)
    std::stable_sort(candidates.begin(), candidates.end(),
                     [&](uint32_t a, uint32_t b) { return added_[a].content.size() > added_[b].content.size(); });

  auto resolve = [&](const std::optional<std::string>& name, const char* what) -> std::optional<int32_t> {
    if (!name) return std::nullopt;
    auto it = by_name_.find(*name);
    ZP_REQUIRE(it != by_name_.end(), source_, ": ", what, " ", in_quotes(*name), " is not a token of the vocabulary");
    return it->second;
  };
  bos_ = resolve(parts.bos_token, "bos_token");
  eos_ = resolve(parts.eos_token, "eos_token");
  prefix_ = std::move(parts.template_prefix);
  suffix_ = std::move(parts.template_suffix);
  for (int32_t id : prefix_) ZP_REQUIRE(id >= 0 && id < vocab_size(), source_, ": the post-processor adds token id ", id, ", which is not in the vocabulary");
  for (int32_t id : suffix_) ZP_REQUIRE(id >= 0 && id < vocab_size(), source_, ": the post-processor adds token id ", id, ", which is not in the vocabulary");
  // add_bos_token / add_eos_token (tokenizer_config.json) win over the template, as transformers'
  // Llama tokenizers rebuild their post-processor from them.
  if (parts.add_bos_token) {
    if (!prefix_.empty() && bos_ && prefix_.front() == *bos_) prefix_.erase(prefix_.begin());
    if (*parts.add_bos_token) {
      ZP_REQUIRE(bos_.has_value(), source_, ": add_bos_token is true but there is no bos_token");
      prefix_.insert(prefix_.begin(), *bos_);
    }
  }
  if (parts.add_eos_token) {
    if (!suffix_.empty() && eos_ && suffix_.back() == *eos_) suffix_.pop_back();
    if (*parts.add_eos_token) {
      ZP_REQUIRE(eos_.has_value(), source_, ": add_eos_token is true but there is no eos_token");
      suffix_.push_back(*eos_);
    }
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + prefix_.size() + suffix_.size() + 4);
  encode(text, options, out);
  return out;
}

void BpeTokenizer::encode(std::string_view text, const EncodeOptions& options, std::vector<int32_t>& out) const {
  if (options.add_special) out.insert(out.end(), prefix_.begin(), prefix_.end());
  size_t start = 0;  // of the text not yet encoded
  if (!added_.empty()) {
    for (size_t i = 0; i < text.size(); ++i) {
      const auto& candidates = added_by_first_byte_[uint8_t(text[i])];
      for (uint32_t k : candidates) {
        const AddedToken& t = added_[k];
        if (t.special && options.split_special) continue;
        if (text.size() - i < t.content.size() || std::memcmp(text.data() + i, t.content.data(), t.content.size()) != 0)
          continue;
        encode_text(text.substr(start, i - start), 0, out);
        out.push_back(t.id);
        start = i + t.content.size();
        i = start - 1;
        break;
      }
    }
  }
  encode_text(text.substr(start), 0, out);
  if (options.add_special) out.insert(out.end(), suffix_.begin(), suffix_.end());
}

void BpeTokenizer::encode_text(std::string_view text, size_t level, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  if (level == patterns_.size()) return encode_piece(text, out);
  patterns_[level].split(text, [&](std::string_view piece) { encode_text(piece, level + 1, out); });
}

void BpeTokenizer::no_byte_token(uint8_t b) const {
  static const char* hex = "0123456789ABCDEF";
  throw Error(source_ + ": the vocabulary has no token for the byte 0x" + hex[b >> 4] + hex[b & 15] +
              " (written " + in_quotes(byte_level_alphabet().char_of(b)) + "), so a text holding it cannot be encoded");
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    const int32_t id = byte_token_[uint8_t(piece[0])];
    if (id < 0) no_byte_token(uint8_t(piece[0]));
    out.push_back(id);
    return;
  }
  const bool cacheable = piece.size() <= sizeof(CacheSlot::piece);
  const uint64_t hash = std::hash<std::string_view>{}(piece);
  CacheSlot& slot = cache_->slots[hash & (kCacheSlots - 1)];
  if (cacheable) {
    std::lock_guard lock(cache_->mutex);
    if (slot.hash == hash && slot.length == piece.size() && std::memcmp(slot.piece, piece.data(), piece.size()) == 0) {
      out.insert(out.end(), slot.ids, slot.ids + slot.count);
      return;
    }
  }
  const size_t first = out.size();
  auto whole = ignore_merges_ ? by_bytes_.find(piece) : by_bytes_.end();
  if (whole != by_bytes_.end()) out.push_back(whole->second);
  else merge_piece(piece, out);
  const size_t count = out.size() - first;
  if (!cacheable || count > std::size(slot.ids)) return;
  std::lock_guard lock(cache_->mutex);
  slot.hash = hash;
  slot.length = uint8_t(piece.size());
  slot.count = uint8_t(count);
  std::memcpy(slot.piece, piece.data(), piece.size());
  std::copy(out.begin() + int64_t(first), out.end(), slot.ids);
}

void BpeTokenizer::merge_piece(std::string_view piece, std::vector<int32_t>& out) const {
  // The piece's symbols as a linked list over its bytes; a merge joins a symbol with the next one.
  // Candidate pairs wait in a heap ordered by (rank, position); a candidate whose symbols have changed
  // since it was pushed is stale and skipped when it comes up.
  struct Symbol { int32_t id, prev, next; };
  struct Candidate {
    int32_t rank, pos, left_id, right_id, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  thread_local std::vector<Symbol> sym;
  thread_local std::vector<Candidate> heap;  // a min-heap through std::push_heap / pop_heap
  const int32_t n = int32_t(piece.size());
  sym.resize(size_t(n));
  for (int32_t i = 0; i < n; ++i) {
    const int32_t id = byte_token_[uint8_t(piece[size_t(i)])];
    if (id < 0) no_byte_token(uint8_t(piece[size_t(i)]));
    sym[size_t(i)] = {id, i - 1, i + 1 < n ? i + 1 : -1};
  }
  heap.clear();
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = sym[size_t(left)].next;
    if (right < 0) return;
    const int32_t a = sym[size_t(left)].id, b = sym[size_t(right)].id;
    auto it = merges_.find(pair_key(a, b));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, left, a, b, it->second.id});
    std::push_heap(heap.begin(), heap.end(), std::greater<>{});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = sym[size_t(c.pos)];
    if (left.id != c.left_id || left.next < 0 || sym[size_t(left.next)].id != c.right_id) continue;
    const int32_t right = left.next;
    left.id = c.merged;
    left.next = sym[size_t(right)].next;
    if (left.next >= 0) sym[size_t(left.next)].prev = c.pos;
    sym[size_t(right)].id = -1;  // gone: no candidate matches it again
    consider(left.prev);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[size_t(i)].next) out.push_back(sym[size_t(i)].id);
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string s;
  for (size_t k = 0; k < ids.size(); ++k) {
    const int32_t id = ids[k];
    ZP_REQUIRE(id >= 0 && id < vocab_size() && !names_[size_t(id)].empty(), source_, ": token ", k, " of ",
               ids.size(), " has id ", id, ", which is not in the vocabulary of ", vocab_size());
    if (skip_special && special_[size_t(id)]) continue;
    s += bytes_[size_t(id)];
  }
  return s;
}

std::optional<int32_t> BpeTokenizer::token_to_id(std::string_view token) const {
  auto it = by_name_.find(token);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

const std::string& BpeTokenizer::id_to_token(int32_t id) const {
  ZP_REQUIRE(id >= 0 && id < vocab_size() && !names_[size_t(id)].empty(), source_, ": id ", id,
             " is not in the vocabulary of ", vocab_size());
  return names_[size_t(id)];
}

const std::string& BpeTokenizer::token_bytes(int32_t id) const {
  ZP_REQUIRE(id >= 0 && id < vocab_size() && !names_[size_t(id)].empty(), source_, ": id ", id,
             " is not in the vocabulary of ", vocab_size());
  return bytes_[size_t(id)];
}

}  // namespace zp::io
