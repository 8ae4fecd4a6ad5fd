// JSON configuration with a schema of defaults.
//
// The schema is itself a JSON document holding every known key with its default value; a user file
// (and `--set a.b.c=value` overrides) is merged over it. A key that the schema does not know is an
// error naming its full path, and so is a value whose JSON type differs from the default's (numbers
// are one type, except that a key whose default is an integer takes only integral numbers; a
// default of null accepts anything and its reader checks it; "auto" is accepted wherever DeepSpeed
// allows it and resolved by the caller). Keys follow DeepSpeed's ds_config.json names where one
// exists. Every problem of a file (or of one --set) is found before anything is thrown, and one
// zp::Error lists them all, one per line, each naming the key.
#pragma once
#include <nlohmann/json.hpp>
#include <map>
#include <string>
#include <vector>

namespace zp::io {

using json = nlohmann::json;

// The JSON document in file `path`; a file that cannot be opened, parsed, or that nests deeper than
// kMaxJsonDepth (io/bounded_json.h) is a zp::Error naming it ("<path>: cannot open<note>",
// "<path>: not valid JSON: ...").
json read_json_file(const std::string& path, const std::string& note = "");

// Throws one zp::Error listing `problems`, one per line ("N problems in the configuration:" first
// when there are several); does nothing when there are none.
void throw_problems(const std::vector<std::string>& problems);

class Config {
 public:
  // What the constructor and set() do with the problems they find (unknown keys, wrong types, a
  // malformed --set). Throw: one zp::Error with all of them. Keep: record them in problems() and
  // leave the offending key at its default, so that a reader (TrainConfig::from) reports them
  // together with the range and consistency problems it finds itself, in one error.
  enum class OnProblem { Throw, Keep };

  // `schema`: the defaults. `user`: the file's content. Problems name `source` and the key.
  Config(const json& schema, const json& user, const std::string& source, OnProblem on_problem = OnProblem::Throw);
  static Config from_file(const json& schema, const std::string& path, OnProblem on_problem = OnProblem::Throw);

  // Applies "a.b.c=value" (value parsed as JSON when it parses, else taken as a string). A path
  // that goes below a key whose default is null (model.config.n_layer) sets that one key inside
  // the current object; naming the key itself (model.config={...}) replaces the whole value.
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

  // The schema's default at `path` (null below a null-default key).
  const json& default_at(const std::string& path) const;
  // Whether the file or a --set gave `path`, an object holding it, or a key inside it, rather than
  // the schema leaving it at its default.
  bool given(const std::string& path) const;
  // Where the value at `path` came from: the file, or the --set that last assigned it.
  const std::string& origin(const std::string& path) const;
  const std::string& source() const { return source_; }
  // The problems kept (OnProblem::Keep) so far, each a line naming its origin and the key.
  const std::vector<std::string>& problems() const { return problems_; }

 private:
  [[noreturn]] void throw_type(const std::string& path, const json& v) const;
  void merge(const json& schema, json& into, const json& from, const std::string& prefix, const std::string& source,
             std::vector<std::string>& problems);
  void report(std::vector<std::string> found);
  json schema_;
  json j_;
  std::string source_;
  OnProblem on_problem_;
  std::vector<std::string> problems_;
  std::map<std::string, std::string> origin_;  // dotted path of every value a user gave -> its source
};

}  // namespace zp::io
