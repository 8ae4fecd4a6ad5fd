// Reading a hub config.json (transformers' or diffusers'): a missing or mistyped key, or a value we
// do not support, is a zp::Error naming the file (`source`) and the key. A null value counts as
// absent, as the libraries treat it.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace zp::models {

struct HubKeys {
  const nlohmann::json& j;
  const std::string& source;

  bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }
  const nlohmann::json& need(const char* key) const {
    ZP_REQUIRE(has(key), source, ": missing key '", key, "'");
    return j[key];
  }
  template <class T> T get(const char* key) const {
    try {
      return need(key).get<T>();
    } catch (const nlohmann::json::exception&) {
      throw Error(source + ": key '" + key + "' has the wrong type: " + j[key].dump());
    }
  }
  template <class T> T get_or(const char* key, T fallback) const { return has(key) ? get<T>(key) : fallback; }
  [[noreturn]] void unsupported(const char* key, const std::string& why) const {
    throw Error(source + ": key '" + key + "' = " + j[key].dump() + " is not supported (" + why + ")");
  }
  void reject_if(const char* key, const nlohmann::json& bad_value, const std::string& why) const {
    if (j.contains(key) && j[key] == bad_value) unsupported(key, why);
  }
};

}  // namespace zp::models
