#include "io/byte_level_alphabet.h"

namespace zp::io {

namespace {

bool stands_for_itself(int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xF0 | (cp >> 18));
    s += char(0x80 | ((cp >> 12) & 0x3F));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
}

// The code point starting at s[i] and its length in bytes; length 0 for invalid UTF-8 (a bad lead or
// continuation byte, an overlong form, a surrogate, or a code point past U+10FFFF).
std::pair<uint32_t, size_t> next_code_point(std::string_view s, size_t i) {
  const auto c = uint8_t(s[i]);
  if (c < 0x80) return {c, 1};
  size_t n;
  uint32_t cp, min;
  if ((c & 0xE0) == 0xC0) { n = 2; cp = c & 0x1F; min = 0x80; }
  else if ((c & 0xF0) == 0xE0) { n = 3; cp = c & 0x0F; min = 0x800; }
  else if ((c & 0xF8) == 0xF0) { n = 4; cp = c & 0x07; min = 0x10000; }
  else return {0, 0};
  if (i + n > s.size()) return {0, 0};
  for (size_t k = 1; k < n; ++k) {
    const auto d = uint8_t(s[i + k]);
    if ((d & 0xC0) != 0x80) return {0, 0};
    cp = (cp << 6) | (d & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {0, 0};
  return {cp, n};
}

}  // namespace

ByteLevelAlphabet::ByteLevelAlphabet() {
  byte_of_code_point_.fill(-1);
  uint32_t next = 0x100;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = stands_for_itself(b) ? uint32_t(b) : next++;
    append_utf8(chars_[size_t(b)], cp);
    byte_of_code_point_[cp] = int16_t(b);
  }
}

std::string ByteLevelAlphabet::encode(std::string_view bytes) const {
  std::string s;
  s.reserve(bytes.size() * 2);
  for (char c : bytes) s += chars_[uint8_t(c)];
  return s;
}

bool ByteLevelAlphabet::decode(std::string_view text, std::string& out) const {
  std::string r;
  r.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto [cp, n] = next_code_point(text, i);
    if (n == 0) return false;
    if (cp < byte_of_code_point_.size() && byte_of_code_point_[cp] >= 0)
      r += char(byte_of_code_point_[cp]);
    else
      r.append(text.substr(i, n));
    i += n;
  }
  out = std::move(r);
  return true;
}

const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

}  // namespace zp::io
