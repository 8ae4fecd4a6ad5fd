#include "io/split_pattern.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace zp::io {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof(buf));
  return n < 0 ? "PCRE2 error " + std::to_string(code) : std::string(reinterpret_cast<const char*>(buf), size_t(n));
}

// PCRE2's match data cannot be shared between threads; each thread keeps one, with room for the
// whole match only (captures are of no use here: a match of a pattern with groups then returns 0,
// "ovector too small", with the whole match in place).
struct ThreadMatchData {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  ~ThreadMatchData() { pcre2_match_data_free(data); }
};

}  // namespace

struct SplitPattern::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() { if (code) pcre2_code_free(code); }
};

SplitPattern::SplitPattern(const std::string& pattern, bool literal, const std::string& source)
    : pattern_(pattern), compiled_(std::make_unique<Compiled>()) {
  // UCP: \s, \d, \w and [[:classes:]] follow Unicode properties, as in the Rust and Python regex
  // engines the patterns were written for. MATCH_INVALID_UTF: a subject need not be valid UTF-8.
  uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
  if (literal) options |= PCRE2_LITERAL;
  int error = 0;
  PCRE2_SIZE offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error,
                                  &offset, nullptr);
  ZP_REQUIRE(compiled_->code != nullptr, source, ": split pattern '", pattern, "' does not compile at offset ", offset,
             ": ", pcre2_message(error));
  // Without a JIT for this CPU (or with PCRE2 built without one) the interpreter gives the same
  // matches, only more slowly.
  compiled_->jit = pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE) == 0;
}

SplitPattern::~SplitPattern() = default;
SplitPattern::SplitPattern(SplitPattern&&) noexcept = default;
SplitPattern& SplitPattern::operator=(SplitPattern&&) noexcept = default;

void SplitPattern::split(std::string_view text, const std::function<void(std::string_view)>& piece) const {
  thread_local ThreadMatchData md;
  ZP_CHECK(md.data != nullptr, "out of memory for PCRE2 match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t at = 0;     // where the next piece starts
  size_t from = 0;   // where the next search starts
  while (from < n) {
    const int rc = compiled_->jit ? pcre2_jit_match(compiled_->code, subject, n, from, 0, md.data, nullptr)
                                  : pcre2_match(compiled_->code, subject, n, from, 0, md.data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    ZP_REQUIRE(rc >= 0, "split pattern '", pattern_, "' failed on a text of ", n, " bytes at byte ", from, ": ",
               pcre2_message(rc));
    // Copied out before any piece is handed over: the callback may split again on this thread (the
    // next pattern of a Sequence), reusing the thread's match data.
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.data);
    const size_t begin = ov[0], end = ov[1];
    if (end == begin) {
      // An empty match cuts nothing; search again one character on (the patterns of real tokenizers
      // never match empty, but a user's might).
      from = end + 1;
      while (from < n && (uint8_t(text[from]) & 0xC0) == 0x80) ++from;
      continue;
    }
    if (begin > at) piece(text.substr(at, begin - at));
    piece(text.substr(begin, end - begin));
    at = from = end;
  }
  if (at < n) piece(text.substr(at));
}

}  // namespace zp::io
