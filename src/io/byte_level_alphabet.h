// GPT-2's byte-level alphabet (openai/gpt-2 encoder.py bytes_to_unicode, Hugging Face's ByteLevel):
// every byte is written as one printable Unicode character, so that a vocabulary of byte strings can
// be stored as text. Printable Latin-1 bytes stand for themselves; the 68 others (control bytes, space,
// 0x7F-0xA0, 0xAD) become U+0100 onwards in byte order, so a space is "Ġ" (U+0120), "\n" is "Ċ".
// Vocabulary and merges files hold tokens in this form; the tokenizer works on the bytes they stand for.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace zp::io {

class ByteLevelAlphabet {
 public:
  ByteLevelAlphabet();
  // The UTF-8 encoding of the character that stands for byte `b`.
  const std::string& char_of(uint8_t b) const { return chars_[b]; }
  // `bytes` written in the alphabet.
  std::string encode(std::string_view bytes) const;
  // The bytes that `text` (UTF-8) stands for. A character outside the alphabet (as in an added token
  // stored in a vocabulary: "<|endoftext|>" is all printable ASCII, but a vocabulary may hold others)
  // stands for its own UTF-8 bytes, as Hugging Face's ByteLevel decoder has it. Returns false, with
  // `out` unchanged, when `text` is not valid UTF-8.
  bool decode(std::string_view text, std::string& out) const;

 private:
  std::array<std::string, 256> chars_;
  std::array<int16_t, 0x144> byte_of_code_point_;  // -1 where a code point stands for no byte
};

// The one alphabet (immutable, built once).
const ByteLevelAlphabet& byte_level_alphabet();

}  // namespace zp::io
