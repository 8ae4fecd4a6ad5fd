#include "runtime/eval_tasks.h"

#include <fstream>
#include <set>

#include "core/error.h"
#include "io/bounded_json.h"

namespace zp::runtime {

using nlohmann::json;

const char* output_type_name(EvalOutputType t) {
  switch (t) {
    case EvalOutputType::MultipleChoice: return "multiple_choice";
    case EvalOutputType::LoglikelihoodRolling: return "loglikelihood_rolling";
    case EvalOutputType::GenerateUntil: return "generate_until";
  }
  return "?";
}

namespace {

// One line's object, with the place ("FILE:LINE") every message about it starts with.
struct Line {
  const json& j;
  std::string where;

  [[noreturn]] void fail(const std::string& field, const std::string& why) const {
    throw Error(where + ": field '" + field + "' " + why);
  }
  void only_keys(const std::set<std::string>& allowed, const char* what) const {
    for (const auto& [k, v] : j.items())
      if (!allowed.count(k)) {
        std::string list;
        for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
        throw Error(where + ": unknown field '" + k + "' in " + what + " (known: " + list + ")");
      }
  }
  const json* optional(const std::string& field) const {
    auto it = j.find(field);
    return it == j.end() ? nullptr : &*it;
  }
  const json& required(const std::string& field) const {
    const json* v = optional(field);
    if (!v) throw Error(where + ": missing field '" + field + "'");
    return *v;
  }
  std::string string_of(const json& v, const std::string& field) const {
    if (!v.is_string()) fail(field, "must be a string, got " + io::json_excerpt(v));
    return v.get<std::string>();
  }
  std::string string(const std::string& field) const { return string_of(required(field), field); }
  std::vector<std::string> strings(const std::string& field) const {
    const json& v = required(field);
    if (!v.is_array()) fail(field, "must be an array of strings, got " + io::json_excerpt(v));
    std::vector<std::string> out;
    for (size_t i = 0; i < v.size(); ++i) out.push_back(string_of(v[i], field + "[" + std::to_string(i) + "]"));
    return out;
  }
  int64_t integer(const std::string& field) const {
    const json& v = required(field);
    if (!v.is_number_integer()) fail(field, "must be an integer, got " + io::json_excerpt(v));
    return v.get<int64_t>();
  }
};

void read_header(const Line& h, EvalTask& t) {
  if (!h.j.is_object())
    throw Error(h.where + ": the first line must be the task's header object ({\"task\": ..., \"output_type\": ...}), got " +
                io::json_excerpt(h.j));
  h.only_keys({"task", "output_type", "target_delimiter", "fewshot_delimiter", "until", "max_gen_toks", "version"},
              "the task header");
  t.name = h.string("task");
  if (t.name.empty()) h.fail("task", "must not be empty");
  const std::string type = h.string("output_type");
  if (type == "multiple_choice") t.output_type = EvalOutputType::MultipleChoice;
  else if (type == "loglikelihood_rolling") t.output_type = EvalOutputType::LoglikelihoodRolling;
  else if (type == "generate_until") t.output_type = EvalOutputType::GenerateUntil;
  else h.fail("output_type", "must be multiple_choice, loglikelihood_rolling or generate_until, got '" + type + "'");
  if (h.optional("target_delimiter")) t.target_delimiter = h.string("target_delimiter");
  if (h.optional("fewshot_delimiter")) t.fewshot_delimiter = h.string("fewshot_delimiter");
  const bool gen = t.output_type == EvalOutputType::GenerateUntil;
  for (const char* k : {"until", "max_gen_toks"})
    if (!gen && h.optional(k)) h.fail(k, "applies to output_type generate_until only");
  // The harness's default when a task gives no generation_kwargs: stop at the few-shot delimiter.
  if (gen) t.until = h.optional("until") ? h.strings("until") : std::vector<std::string>{t.fewshot_delimiter};
  if (h.optional("max_gen_toks")) {
    t.max_gen_toks = h.integer("max_gen_toks");
    if (t.max_gen_toks < 1) h.fail("max_gen_toks", "must be at least 1, got " + std::to_string(t.max_gen_toks));
  }
  if (const json* v = h.optional("version")) {
    if (!v->is_number()) h.fail("version", "must be a number, got " + io::json_excerpt(*v));
    t.version = v->get<double>();
  }
}

EvalDocument read_document(const Line& d, const EvalTask& t, int64_t line) {
  if (!d.j.is_object()) throw Error(d.where + ": a document must be a JSON object, got " + io::json_excerpt(d.j));
  EvalDocument doc;
  doc.line = line;
  switch (t.output_type) {
    case EvalOutputType::MultipleChoice: {
      d.only_keys({"context", "choices", "gold"}, "a multiple_choice document");
      doc.context = d.string("context");
      doc.choices = d.strings("choices");
      if (doc.choices.empty()) d.fail("choices", "must hold at least one choice");
      doc.gold = d.integer("gold");
      if (doc.gold < 0 || doc.gold >= int64_t(doc.choices.size()))
        d.fail("gold", "is " + std::to_string(doc.gold) + ", outside the " + std::to_string(doc.choices.size()) +
                           " choices (0-based)");
      // The harness divides by the choice's length for acc_norm.
      for (size_t i = 0; i < doc.choices.size(); ++i)
        if (doc.choices[i].empty()) d.fail("choices[" + std::to_string(i) + "]", "must not be empty");
      break;
    }
    case EvalOutputType::LoglikelihoodRolling:
      d.only_keys({"text"}, "a loglikelihood_rolling document");
      doc.text = d.string("text");
      if (doc.text.empty()) d.fail("text", "must not be empty (there is nothing to score)");
      break;
    case EvalOutputType::GenerateUntil:
      d.only_keys({"context", "target"}, "a generate_until document");
      doc.context = d.string("context");
      doc.target = d.string("target");
      break;
  }
  return doc;
}

}  // namespace

EvalTask read_eval_task(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ZP_REQUIRE(in.good(), path, ": cannot open the task file");
  EvalTask t;
  t.path = path;
  bool have_header = false;
  std::string text;
  for (int64_t n = 1; std::getline(in, text); ++n) {
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    const json j = io::parse_json_bounded(std::string_view(text), where);
    const Line line{j, where};
    if (!have_header) {
      read_header(line, t);
      have_header = true;
    } else {
      t.docs.push_back(read_document(line, t, n));
    }
  }
  ZP_REQUIRE(!in.bad(), path, ": read error");
  ZP_REQUIRE(have_header, path, ": empty; a task file starts with a header line {\"task\": ..., \"output_type\": ...}");
  ZP_REQUIRE(!t.docs.empty(), path, ": the header is followed by no document");
  return t;
}

}  // namespace zp::runtime
