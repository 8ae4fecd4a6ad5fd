// Reading a hub config.json (transformers' or diffusers'): a missing or mistyped key, or a value we
// do not support, is a zp::Error naming the file (`source`) and the key. A null value counts as
// absent, as the libraries treat it. Values are quoted through io::json_excerpt, so a huge or
// deeply nested value cannot blow up a message.
#pragma once
#include <nlohmann/json.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "io/bounded_json.h"

namespace zp::models {

struct HubKeys {
  const nlohmann::json& j;
  const std::string& source;
  const char* prefix = "";  // the path of `j` inside the file ("rope_parameters."), for messages

  // The largest size (channels, heads, layers, vocabulary, ...) a config may give: a product of two
  // sizes then stays below 2^62, and each reader checks the products that make up its model.
  static constexpr int64_t kMaxSize = int64_t(1) << 31;

  std::string name(const char* key) const { return std::string(prefix) + key; }
  bool has(const char* key) const { return j.is_object() && j.contains(key) && !j[key].is_null(); }
  const nlohmann::json& need(const char* key) const {
    ZP_REQUIRE(has(key), source, ": missing key '", name(key), "'");
    return j[key];
  }
  [[noreturn]] void wrong_type(const char* key, const std::string& want) const {
    throw Error(source + ": key '" + name(key) + "' = " + io::json_excerpt(j[key]) + " must be " + want);
  }
  template <class T> T get(const char* key) const {
    const nlohmann::json& v = need(key);
    if constexpr (std::is_same_v<T, bool>) {
      if (!v.is_boolean()) wrong_type(key, "true or false");
      return v.get<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      // nlohmann would truncate 2.5 to 2 and wrap 2^64 - 1 to -1.
      const bool fits = v.is_number_integer() &&
                        (v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max())
                                                : v.get<int64_t>() >= int64_t(std::numeric_limits<T>::min()) &&
                                                      v.get<int64_t>() <= int64_t(std::numeric_limits<T>::max()));
      if (!fits) wrong_type(key, "an integer");
      return T(v.get<int64_t>());
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!v.is_number() || !std::isfinite(v.get<double>())) wrong_type(key, "a finite number");
      return v.get<T>();
    } else {
      try {
        return v.get<T>();
      } catch (const nlohmann::json::exception&) {
        throw Error(source + ": key '" + name(key) + "' has the wrong type: " + io::json_excerpt(v));
      }
    }
  }
  template <class T> T get_or(const char* key, T fallback) const { return has(key) ? get<T>(key) : fallback; }

  // A size: an integer in [1, kMaxSize].
  int64_t size(const char* key) const {
    const nlohmann::json& v = need(key);
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(kMaxSize)) ||
        v.get<int64_t>() < 1 || v.get<int64_t>() > kMaxSize)
      wrong_type(key, "an integer in [1, 2^31]");
    return v.get<int64_t>();
  }
  int64_t size_or(const char* key, int64_t fallback) const { return has(key) ? size(key) : fallback; }
  // A list of sizes.
  std::vector<int64_t> sizes(const char* key) const {
    const nlohmann::json& v = need(key);
    std::vector<int64_t> out;
    if (v.is_array())
      for (const nlohmann::json& e : v)
        if (e.is_number_integer() && !(e.is_number_unsigned() && e.get<uint64_t>() > uint64_t(kMaxSize)) &&
            e.get<int64_t>() >= 1 && e.get<int64_t>() <= kMaxSize)
          out.push_back(e.get<int64_t>());
    if (!v.is_array() || out.size() != v.size()) wrong_type(key, "a list of integers, each in [1, 2^31]");
    return out;
  }
  // A finite number that a float holds (scales, shifts), and one that is also > 0 (epsilons,
  // rope_theta): the engine keeps them as floats.
  float float_or(const char* key, double fallback) const {
    const double x = get_or<double>(key, fallback);
    if (std::fabs(x) > double(std::numeric_limits<float>::max())) wrong_type(key, "a finite number (as a float)");
    return float(x);
  }
  float positive_float_or(const char* key, double fallback) const {
    if (!has(key)) return float(fallback);
    const nlohmann::json& v = j[key];
    const double x = v.is_number() ? v.get<double>() : 0.0;
    // float(x) > 0 also turns away what a float rounds to zero (1e-50).
    if (!std::isfinite(x) || x > double(std::numeric_limits<float>::max()) || !(float(x) > 0))
      wrong_type(key, "a finite number > 0 (as a float)");
    return float(x);
  }

  [[noreturn]] void unsupported(const char* key, const std::string& why) const {
    throw Error(source + ": key '" + name(key) + "' = " + io::json_excerpt(j[key]) + " is not supported (" + why + ")");
  }
  void reject_if(const char* key, const nlohmann::json& bad_value, const std::string& why) const {
    // Scalars only: comparing against a deeply nested value would recurse.
    if (j.contains(key) && !j[key].is_structured() && j[key] == bad_value) unsupported(key, why);
  }
};

// Runs `read` (a config reader made of HubKeys calls); a JSON exception that an explicit check
// missed becomes a zp::Error naming `source`, never an abort.
template <class F> auto named_json_errors(const std::string& source, F&& read) {
  try {
    return read();
  } catch (const nlohmann::json::exception& e) {
    throw Error(source + ": " + io::text_excerpt(e.what()));
  }
}

}  // namespace zp::models
