// Typed reads of a Config's values with the ranges they allow. Every problem is collected, starting
// with those the Config kept while merging (unknown keys, wrong types), so that one zp::Error
// reports all of a configuration's mistakes in one run, one per line, each naming its key, the
// value given and what is allowed. A value that is wrong reads as its schema default, so checks
// that combine keys do not report the same mistake a second time.
#pragma once
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "io/config.h"

namespace zp::io {

// An interval of allowed numbers; each end open or closed, either may be infinite.
struct Range {
  double lo = -std::numeric_limits<double>::infinity(), hi = std::numeric_limits<double>::infinity();
  bool lo_open = false, hi_open = false;

  static Range at_least(double lo) { return {lo, std::numeric_limits<double>::infinity(), false, false}; }
  static Range above(double lo) { return {lo, std::numeric_limits<double>::infinity(), true, false}; }
  static Range closed(double lo, double hi) { return {lo, hi, false, false}; }
  static Range half_open(double lo, double hi) { return {lo, hi, false, true}; }  // [lo, hi)
  bool contains(double x) const;
  std::string describe() const;  // ">= 0", "> 0", "in [0, 1)"
};

class ConfigReader {
 public:
  explicit ConfigReader(const Config& c);

  // An integer in [lo, hi].
  int64_t integer(const std::string& key, int64_t lo, int64_t hi = std::numeric_limits<int64_t>::max());
  // For a key whose default is null: nullopt for null or "auto", else an integer in [lo, hi].
  std::optional<int64_t> integer_or_auto(const std::string& key, int64_t lo,
                                         int64_t hi = std::numeric_limits<int64_t>::max());
  // A non-negative integer up to 2^64 - 1 (seeds).
  uint64_t unsigned_integer(const std::string& key);
  // A finite number in `allowed`.
  double number(const std::string& key, const Range& allowed);
  // For a key whose default is null: nullopt for null, else a finite number in `allowed`.
  std::optional<double> number_or_null(const std::string& key, const Range& allowed);
  // An array of exactly `count` finite numbers, each in `allowed`.
  std::vector<double> numbers(const std::string& key, size_t count, const Range& allowed);
  bool boolean(const std::string& key);
  std::string string(const std::string& key);
  // One of `allowed`; `why` (optional) says why the others are not.
  std::string one_of(const std::string& key, const std::vector<std::string>& allowed, const std::string& why = "");
  std::vector<std::string> strings(const std::string& key);
  const json& value(const std::string& key) const;
  // From now on `key` reads as `resolved` where the configuration says "auto" (as the Hugging Face
  // Trainer fills in DeepSpeed's "auto" from its own arguments); returns whether it said "auto".
  bool resolve_auto(const std::string& key, const json& resolved);
  const Config& config() const { return c_; }

  // Records `what` (a sentence naming the keys involved) when `ok` is false; returns `ok`.
  bool require(bool ok, const std::string& what);
  // Records "key '<key>' = <value> <what>".
  void reject(const std::string& key, const std::string& what);
  const std::vector<std::string>& problems() const { return problems_; }
  // Records a warning (a key accepted with no effect, or one whose effect differs from DeepSpeed's);
  // the same text is recorded once.
  void warn(const std::string& text);
  const std::vector<std::string>& warnings() const { return warnings_; }
  // Throws one zp::Error listing every problem (io::throw_problems); nothing when there are none.
  void throw_if_any() const { throw_problems(problems_); }

 private:
  const json& fallback(const std::string& key) const { return c_.default_at(key); }
  const Config& c_;
  std::vector<std::string> problems_, warnings_;
  std::map<std::string, json> resolved_;  // "auto" keys -> the value they read as
};

}  // namespace zp::io
