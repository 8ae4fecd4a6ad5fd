// JSON configuration with a schema of defaults.
//
// The schema is itself a JSON document holding every known key with its default value; a user file
// (and `--set a.b.c=value` overrides) is merged over it. A key that the schema does not know is an
// error naming its full path, and so is a value whose JSON type differs from the default's (numbers
// are one type; a default of null accepts anything; "auto" is accepted wherever DeepSpeed allows it
// and resolved by the caller). Keys follow DeepSpeed's ds_config.json names where one exists.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace zp::io {

using json = nlohmann::json;

// The JSON document in file `path`; a file that cannot be opened or parsed is a zp::Error naming it
// ("<path>: cannot open<note>", "<path>: not valid JSON: ...").
json read_json_file(const std::string& path, const std::string& note = "");

class Config {
 public:
  // `schema`: the defaults. `user`: the file's content. Throws zp::Error naming `source` and the key.
  Config(const json& schema, const json& user, const std::string& source);
  static Config from_file(const json& schema, const std::string& path);

  // Applies "a.b.c=value" (value parsed as JSON when it parses, else taken as a string).
  void set(const std::string& assignment);

  const json& root() const { return j_; }
  // Value at a dotted path ("zero_optimization.stage"); throws naming the path if absent or mistyped.
  const json& at(const std::string& path) const;
  template <class T> T get(const std::string& path) const {
    const json& v = at(path);
    try {
      return v.get<T>();
    } catch (const std::exception& e) {
      throw_type(path, v);
    }
  }
  bool is_auto(const std::string& path) const { const json& v = at(path); return v.is_string() && v == "auto"; }
  std::string dump() const { return j_.dump(2); }

 private:
  [[noreturn]] static void throw_type(const std::string& path, const json& v);
  void merge(const json& schema, json& into, const json& from, const std::string& prefix);
  json schema_;
  json j_;
  std::string source_;
};

}  // namespace zp::io
