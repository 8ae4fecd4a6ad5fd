// A pre-tokenizer's split pattern: a regular expression (PCRE2, Unicode properties on) whose matches
// cut text into pieces, Hugging Face's Split with behavior "Isolated": every match is a piece and so
// is every stretch between matches. The BPE merges never cross a piece's ends.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace zp::io {

// GPT-2's pattern (openai/gpt-2 encoder.py; Hugging Face ByteLevel with use_regex).
inline constexpr const char* kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3's (its tokenizer.json's Split): contractions in any case, digits in runs of at most three.
inline constexpr const char* kLlama3SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2's: Llama 3's with every digit its own piece.
inline constexpr const char* kQwen2SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

class SplitPattern {
 public:
  // `pattern` is a regular expression (literal=false) or a string to split on as it is (a Split's
  // {"String": ...} form). A pattern PCRE2 refuses is a zp::Error naming `source`, the offset and
  // PCRE2's message. The pattern is JIT-compiled where PCRE2 has a JIT for this machine.
  SplitPattern(const std::string& pattern, bool literal, const std::string& source);
  ~SplitPattern();
  SplitPattern(SplitPattern&&) noexcept;
  SplitPattern& operator=(SplitPattern&&) noexcept;

  // Calls `piece` with the pieces of `text`, in order; they cover it exactly. Text that is not valid
  // UTF-8 is split too: invalid bytes never match, so they end up in the stretches between matches
  // and survive as bytes. Safe to call from several threads at once. Pieces are handed over one at a
  // time rather than collected: a document of 100 MB has some 30 million.
  void split(std::string_view text, const std::function<void(std::string_view)>& piece) const;
  void split(std::string_view text, std::vector<std::string_view>& pieces) const {
    split(text, [&](std::string_view p) { pieces.push_back(p); });
  }
  const std::string& pattern() const { return pattern_; }

 private:
  struct Compiled;
  std::string pattern_;
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace zp::io
