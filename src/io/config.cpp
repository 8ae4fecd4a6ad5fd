#include "io/config.h"

#include <fstream>

#include "core/error.h"

namespace zp::io {
namespace {

bool same_kind(const json& a, const json& b) {
  if (a.is_null()) return true;
  if (a.is_number() && b.is_number()) return true;
  return a.type() == b.type();
}

std::string kind(const json& v) {
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  return "null";
}

std::vector<std::string> split_path(const std::string& p) {
  std::vector<std::string> parts;
  size_t b = 0;
  while (true) {
    size_t e = p.find('.', b);
    parts.push_back(p.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return parts;
}

}  // namespace

Config::Config(const json& schema, const json& user, const std::string& source)
    : schema_(schema), j_(schema), source_(source) {
  ZP_REQUIRE(user.is_object(), source, ": the configuration must be a JSON object");
  merge(schema_, j_, user, "");
}

json read_json_file(const std::string& path, const std::string& note) {
  std::ifstream in(path);
  ZP_REQUIRE(in.good(), path, ": cannot open", note);
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
}

Config Config::from_file(const json& schema, const std::string& path) {
  std::ifstream in(path);
  ZP_REQUIRE(in.good(), path, ": cannot open the configuration file");
  json user;
  try {
    user = json::parse(in, nullptr, true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
  return Config(schema, user, path);
}

void Config::merge(const json& schema, json& into, const json& from, const std::string& prefix) {
  for (auto& [k, v] : from.items()) {
    std::string path = prefix.empty() ? k : prefix + "." + k;
    ZP_REQUIRE(schema.contains(k), source_, ": unknown key '", path, "'");
    const json& def = schema[k];
    if (def.is_object() && !def.empty()) {
      ZP_REQUIRE(v.is_object(), source_, ": key '", path, "' must be an object, got ", kind(v));
      merge(def, into[k], v, path);
      continue;
    }
    bool auto_ok = v.is_string() && v == "auto";
    ZP_REQUIRE(same_kind(def, v) || auto_ok, source_, ": key '", path, "' must be ", kind(def), ", got ", kind(v),
               " (", v.dump(), ")");
    into[k] = v;
  }
}

void Config::set(const std::string& assignment) {
  size_t eq = assignment.find('=');
  ZP_REQUIRE(eq != std::string::npos && eq > 0, "--set '", assignment, "': expected key.path=value");
  std::string path = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  json value;
  try {
    value = json::parse(text);
  } catch (const json::parse_error&) {
    value = text;
  }
  json nested = value;
  auto parts = split_path(path);
  for (size_t i = parts.size(); i-- > 0;) nested = json{{parts[i], nested}};
  std::string keep = source_;
  source_ = "--set " + assignment;
  merge(schema_, j_, nested, "");
  source_ = keep;
}

const json& Config::at(const std::string& path) const {
  const json* cur = &j_;
  for (const auto& p : split_path(path)) {
    ZP_REQUIRE(cur->is_object() && cur->contains(p), source_, ": no configuration key '", path, "'");
    cur = &(*cur)[p];
  }
  return *cur;
}

void Config::throw_type(const std::string& path, const json& v) {
  throw Error("configuration key '" + path + "' has the wrong type: " + v.dump());
}

}  // namespace zp::io
