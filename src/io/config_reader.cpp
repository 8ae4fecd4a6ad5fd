#include "io/config_reader.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "io/bounded_json.h"

namespace zp::io {
namespace {

std::string number_text(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

std::string integer_range(int64_t lo, int64_t hi) {
  if (hi == std::numeric_limits<int64_t>::max()) return ">= " + std::to_string(lo);
  return "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

bool is_auto(const json& v) { return v.is_string() && v == "auto"; }

}  // namespace

bool Range::contains(double x) const {
  return (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
}

std::string Range::describe() const {
  if (std::isinf(hi)) return (lo_open ? "> " : ">= ") + number_text(lo);
  if (std::isinf(lo)) return (hi_open ? "< " : "<= ") + number_text(hi);
  return std::string("in ") + (lo_open ? "(" : "[") + number_text(lo) + ", " + number_text(hi) + (hi_open ? ")" : "]");
}

ConfigReader::ConfigReader(const Config& c) : c_(c), problems_(c.problems()) {}

const json& ConfigReader::value(const std::string& key) const {
  if (auto it = resolved_.find(key); it != resolved_.end()) return it->second;
  return c_.at(key);
}

bool ConfigReader::resolve_auto(const std::string& key, const json& resolved) {
  if (!is_auto(c_.at(key))) return false;
  resolved_[key] = resolved;
  return true;
}

void ConfigReader::warn(const std::string& text) {
  if (std::find(warnings_.begin(), warnings_.end(), text) == warnings_.end()) warnings_.push_back(text);
}

bool ConfigReader::require(bool ok, const std::string& what) {
  if (!ok) problems_.push_back(c_.source() + ": " + what);
  return ok;
}

void ConfigReader::reject(const std::string& key, const std::string& what) {
  problems_.push_back(c_.origin(key) + ": key '" + key + "' = " + json_excerpt(value(key)) + " " + what);
}

int64_t ConfigReader::integer(const std::string& key, int64_t lo, int64_t hi) {
  const json& v = value(key);
  const std::string allowed = "an integer " + integer_range(lo, hi);
  if (is_auto(v)) {
    reject(key, "is not resolved for this key: give " + allowed);
  } else if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
    reject(key, "is out of range: must be " + integer_range(lo, hi));
  } else if (!v.is_number_integer()) {
    reject(key, "must be " + allowed);
  } else if (const int64_t x = v.get<int64_t>(); x < lo || x > hi) {
    reject(key, "is out of range: must be " + integer_range(lo, hi));
  } else {
    return x;
  }
  return fallback(key).get<int64_t>();
}

std::optional<int64_t> ConfigReader::integer_or_auto(const std::string& key, int64_t lo, int64_t hi) {
  const json& v = value(key);
  if (v.is_null() || is_auto(v)) return std::nullopt;
  const bool integral = v.is_number_integer() ||
                        (v.is_number_float() && std::isfinite(v.get<double>()) && v.get<double>() == std::trunc(v.get<double>()));
  const bool fits = integral && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) &&
                    (!v.is_number_float() || std::fabs(v.get<double>()) < 9223372036854775808.0);
  if (fits) {
    const int64_t x = v.is_number_float() ? int64_t(v.get<double>()) : v.get<int64_t>();
    if (x >= lo && x <= hi) return x;
  }
  reject(key, "is not allowed: must be an integer " + integer_range(lo, hi) + ", \"auto\" or null");
  return std::nullopt;
}

uint64_t ConfigReader::unsigned_integer(const std::string& key) {
  const json& v = value(key);
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return uint64_t(v.get<int64_t>());
  reject(key, "is not allowed: must be an integer in [0, 2^64)");
  return fallback(key).get<uint64_t>();
}

double ConfigReader::number(const std::string& key, const Range& allowed) {
  const json& v = value(key);
  if (!v.is_number() || is_auto(v))
    reject(key, "is not allowed: must be a number " + allowed.describe());
  else if (const double x = v.get<double>(); !std::isfinite(x) || !allowed.contains(x))
    reject(key, "is out of range: must be " + allowed.describe());
  else
    return x;
  return fallback(key).get<double>();
}

std::optional<double> ConfigReader::number_or_null(const std::string& key, const Range& allowed) {
  const json& v = value(key);
  if (v.is_null()) return std::nullopt;
  if (v.is_number() && std::isfinite(v.get<double>()) && allowed.contains(v.get<double>())) return v.get<double>();
  reject(key, "is not allowed: must be a number " + allowed.describe() + " or null");
  return std::nullopt;
}

std::vector<double> ConfigReader::numbers(const std::string& key, size_t count, const Range& allowed) {
  const json& v = value(key);
  bool ok = v.is_array() && v.size() == count;
  std::vector<double> out;
  for (size_t i = 0; ok && i < count; ++i) {
    ok = v[i].is_number() && std::isfinite(v[i].get<double>()) && allowed.contains(v[i].get<double>());
    if (ok) out.push_back(v[i].get<double>());
  }
  if (ok) return out;
  reject(key, "is not allowed: must be " + std::to_string(count) + " numbers, each " + allowed.describe());
  return fallback(key).get<std::vector<double>>();
}

bool ConfigReader::boolean(const std::string& key) {
  const json& v = value(key);
  if (v.is_boolean()) return v.get<bool>();
  reject(key, "is not allowed: must be true or false");
  return fallback(key).get<bool>();
}

std::string ConfigReader::string(const std::string& key) {
  const json& v = value(key);
  if (v.is_string()) return v.get<std::string>();
  reject(key, "is not allowed: must be a string");
  return fallback(key).get<std::string>();
}

std::string ConfigReader::one_of(const std::string& key, const std::vector<std::string>& allowed, const std::string& why) {
  const json& v = value(key);
  if (v.is_string())
    for (const std::string& a : allowed)
      if (v == a) return a;
  std::string list;
  for (size_t i = 0; i < allowed.size(); ++i) list += (i ? ", \"" : "\"") + allowed[i] + "\"";
  reject(key, "is not supported: must be " + std::string(allowed.size() == 1 ? "" : "one of ") + list +
                  (why.empty() ? "" : " (" + why + ")"));
  return fallback(key).get<std::string>();
}

std::vector<std::string> ConfigReader::strings(const std::string& key) {
  const json& v = value(key);
  bool ok = v.is_array();
  for (size_t i = 0; ok && i < v.size(); ++i) ok = v[i].is_string();
  if (ok) return v.get<std::vector<std::string>>();
  reject(key, "is not allowed: must be an array of strings");
  return fallback(key).get<std::vector<std::string>>();
}

}  // namespace zp::io
