// Evaluation task files (`zeropipe eval --tasks FILE...`, issue 13): one JSONL file per task, in the
// terms of lm-evaluation-harness's task configs.
//
// The first line is a header object:
//   {"task": "licenses_mc", "output_type": "multiple_choice" | "loglikelihood_rolling" | "generate_until",
//    "target_delimiter": " ",            (optional; the harness's default, one space)
//    "fewshot_delimiter": "\n\n",        (optional; generate_until's default `until`, as in the harness)
//    "until": ["\n"],                    (generate_until, optional; default [fewshot_delimiter])
//    "max_gen_toks": 256,                (generate_until, optional; the harness's default)
//    "version": 1.0}                     (optional; reported under "versions", null when absent)
// and every further line is one document:
//   multiple_choice:        {"context": STR, "choices": [STR, ...], "gold": INT}
//   loglikelihood_rolling:  {"text": STR}
//   generate_until:         {"context": STR, "target": STR}
// Contexts are final: a document's context is what the harness's doc_to_text (with any description
// and few-shot examples already in it) would give, so the file needs no templates.
// Blank lines are skipped. An unknown key, a missing or mistyped field, a gold index outside the
// choices, or an empty file is a zp::Error naming FILE:LINE and the field.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace zp::runtime {

enum class EvalOutputType { MultipleChoice, LoglikelihoodRolling, GenerateUntil };

// "multiple_choice", "loglikelihood_rolling", "generate_until": the harness's spelling.
const char* output_type_name(EvalOutputType t);

struct EvalDocument {
  int64_t line = 0;             // where it is in its file (for messages)
  std::string context;          // multiple_choice, generate_until
  std::vector<std::string> choices;  // multiple_choice
  int64_t gold = 0;                  // multiple_choice: index into choices
  std::string text;             // loglikelihood_rolling
  std::string target;           // generate_until
};

struct EvalTask {
  std::string path;  // the file it was read from
  std::string name;
  EvalOutputType output_type = EvalOutputType::MultipleChoice;
  std::string target_delimiter = " ";
  std::string fewshot_delimiter = "\n\n";
  std::vector<std::string> until;  // generate_until: never empty after reading
  int64_t max_gen_toks = 256;
  std::optional<double> version;
  std::vector<EvalDocument> docs;
};

// Reads and checks one task file (see the top of this file).
EvalTask read_eval_task(const std::string& path);

}  // namespace zp::runtime
