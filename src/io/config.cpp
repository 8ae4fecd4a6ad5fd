#include "io/config.h"

#include <cmath>
#include <fstream>

#include "core/error.h"
#include "io/bounded_json.h"

namespace zp::io {
namespace {

bool same_kind(const json& a, const json& b) {
  if (a.is_null()) return true;
  if (a.is_number() && b.is_number()) return true;
  return a.type() == b.type();
}

std::string kind(const json& v) {
  if (v.is_number_integer()) return "a number (an integer)";
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

std::string join_path(const std::vector<std::string>& parts, size_t n) {
  std::string p;
  for (size_t i = 0; i < n; ++i) p += (i ? "." : "") + parts[i];
  return p;
}

// 2^63 as a double: the first value past int64's range.
constexpr double kInt64End = 9223372036854775808.0;

// The value to store for `v` at a leaf whose default is `def`, or "" with `problem` filled in.
// Integral doubles (2.0, 1e3) at an integer key are stored as integers.
bool check_leaf(const json& def, const json& v, const std::string& where, json& store, std::string& problem) {
  const bool is_auto = v.is_string() && v == "auto";
  if (!same_kind(def, v) && !is_auto) {
    problem = where + " must be " + kind(def) + ", got " + kind(v) + " (" + json_excerpt(v) + ")";
    return false;
  }
  if (nested_deeper_than(v, kMaxJsonDepth)) {
    problem = where + " nests deeper than " + std::to_string(kMaxJsonDepth) + " levels";
    return false;
  }
  if (v.is_number_float()) {
    const double x = v.get<double>();
    if (!std::isfinite(x)) {
      problem = where + " must be a finite number, got " + json_excerpt(v);
      return false;
    }
    if (def.is_number_integer()) {
      if (x != std::trunc(x) || x < -kInt64End || x >= kInt64End) {
        problem = where + " must be an integer (its default is " + def.dump() + "), got " + json_excerpt(v);
        return false;
      }
      store = int64_t(x);
      return true;
    }
  }
  store = v;
  return true;
}

}  // namespace

void throw_problems(const std::vector<std::string>& problems) {
  if (problems.empty()) return;
  if (problems.size() == 1) throw Error(problems.front());
  std::string m = std::to_string(problems.size()) + " problems in the configuration:";
  for (const std::string& p : problems) m += "\n  " + p;
  throw Error(m);
}

Config::Config(const json& schema, const json& user, const std::string& source, OnProblem on_problem)
    : schema_(schema), j_(schema), source_(source), on_problem_(on_problem) {
  ZP_REQUIRE(user.is_object(), source, ": the configuration must be a JSON object");
  std::vector<std::string> found;
  merge(schema_, j_, user, "", source_, found);
  report(std::move(found));
}

json read_json_file(const std::string& path, const std::string& note) {
  std::ifstream in(path);
  ZP_REQUIRE(in.good(), path, ": cannot open", note);
  return parse_json_bounded(in, path);
}

Config Config::from_file(const json& schema, const std::string& path, OnProblem on_problem) {
  std::ifstream in(path);
  ZP_REQUIRE(in.good(), path, ": cannot open the configuration file");
  return Config(schema, parse_json_bounded(in, path, /*ignore_comments=*/true), path, on_problem);
}

void Config::report(std::vector<std::string> found) {
  if (on_problem_ == OnProblem::Throw) throw_problems(found);
  problems_.insert(problems_.end(), found.begin(), found.end());
}

void Config::merge(const json& schema, json& into, const json& from, const std::string& prefix,
                   const std::string& source, std::vector<std::string>& problems) {
  for (auto& [k, v] : from.items()) {
    const std::string path = prefix.empty() ? k : prefix + "." + k;
    if (!schema.contains(k)) {
      problems.push_back(source + ": unknown key '" + text_excerpt(path) + "'");
      continue;
    }
    const json& def = schema[k];
    if (def.is_object() && !def.empty()) {
      if (!v.is_object())
        problems.push_back(source + ": key '" + path + "' must be an object, got " + kind(v) + " (" + json_excerpt(v) +
                           ")");
      else
        merge(def, into[k], v, path, source, problems);
      continue;
    }
    json store;
    std::string problem;
    if (!check_leaf(def, v, source + ": key '" + path + "'", store, problem)) {
      problems.push_back(problem);
      continue;
    }
    into[k] = std::move(store);
    origin_[path] = source;
  }
}

void Config::set(const std::string& assignment) {
  const std::string source = "--set " + text_excerpt(assignment);
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    return report({"--set '" + text_excerpt(assignment) + "': expected key.path=value"});
  const std::string path = assignment.substr(0, eq);
  json value;
  try {
    value = parse_json_or_string(std::string_view(assignment).substr(eq + 1), source);
  } catch (const Error& e) {
    return report({e.what()});
  }
  auto parts = split_path(path);
  // Below a null-default key (model.config) the schema knows nothing: the assignment edits a copy
  // of the current object at that key, which then replaces it as a whole.
  const json* schema_at = &schema_;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!schema_at->is_object() || !schema_at->contains(parts[i])) break;  // merge reports the unknown key
    schema_at = &(*schema_at)[parts[i]];
    if (!schema_at->is_null()) continue;
    const std::string free_key = join_path(parts, i + 1);
    json edited = at(free_key);
    json* cur = &edited;
    for (size_t d = i + 1; d < parts.size(); ++d) {
      if (cur->is_null()) *cur = json::object();  // a key that did not exist yet
      if (!cur->is_object())
        return report({source + ": cannot set a key inside '" + join_path(parts, d) + "', which is " + kind(*cur) +
                       ", not an object"});
      cur = &(*cur)[parts[d]];
    }
    *cur = std::move(value);
    value = std::move(edited);
    parts.resize(i + 1);  // now an assignment of the whole free-form object
    break;
  }
  json nested = std::move(value);
  for (size_t i = parts.size(); i-- > 0;) nested = json{{parts[i], std::move(nested)}};
  std::vector<std::string> found;
  merge(schema_, j_, nested, "", source, found);
  report(std::move(found));
}

const json& Config::at(const std::string& path) const {
  const json* cur = &j_;
  for (const auto& p : split_path(path)) {
    ZP_REQUIRE(cur->is_object() && cur->contains(p), source_, ": no configuration key '", path, "'");
    cur = &(*cur)[p];
  }
  return *cur;
}

const json& Config::default_at(const std::string& path) const {
  static const json null_value;
  const json* cur = &schema_;
  for (const auto& p : split_path(path)) {
    if (!cur->is_object() || !cur->contains(p)) return null_value;
    cur = &(*cur)[p];
  }
  return *cur;
}

bool Config::given(const std::string& path) const {
  const std::string inside = path + ".";
  if (auto it = origin_.lower_bound(inside); it != origin_.end() && it->first.starts_with(inside)) return true;
  for (std::string p = path;;) {
    if (origin_.count(p)) return true;
    const size_t dot = p.rfind('.');
    if (dot == std::string::npos) return false;
    p.resize(dot);
  }
}

const std::string& Config::origin(const std::string& path) const {
  // The longest prefix a user assigned: model.config.n_layer came with model.config.
  for (std::string p = path;;) {
    auto it = origin_.find(p);
    if (it != origin_.end()) return it->second;
    const size_t dot = p.rfind('.');
    if (dot == std::string::npos) return source_;
    p.resize(dot);
  }
}

void Config::throw_type(const std::string& path, const json& v) const {
  throw Error(origin(path) + ": configuration key '" + path + "' has the wrong type: " + json_excerpt(v));
}

}  // namespace zp::io
