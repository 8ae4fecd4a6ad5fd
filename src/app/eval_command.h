// zeropipe eval: lm-evaluation-harness-style evaluation of a language model on JSONL task files
// (runtime/eval_tasks.h for the files, runtime/lm_evaluation.h for the rules). Under mpirun every rank
// loads the whole model and scores its share of the requests; rank 0 gathers the scores, writes the
// results JSON and prints the harness's table.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/bootstrap.h"
#include "runtime/inference_model.h"

namespace zp::app {

struct EvalOptions {
  runtime::InferenceModelOptions model;  // where the model comes from and runs
  std::vector<std::string> tasks;  // task files
  std::string out;                 // results JSON ("" = none)
  int64_t limit = -1;              // the first N documents of each task
  int64_t max_length = 0;          // 0 = the model's max_positions
  int64_t max_batch_tokens = 8192;
};

// Runs the evaluation on the ranks of `rt`; on rank 0 writes o.out and prints the table. Returns 0.
int run_eval(const EvalOptions& o, comm::Runtime& rt);

}  // namespace zp::app
