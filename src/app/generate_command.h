// `zeropipe generate` (issue 13): a batch job of prompts in JSONL, completions out in JSONL, through
// the continuous-batching engine (runtime/generation_engine.h). Under mpirun the requests are split
// across the ranks (request i on rank i % world), each rank holding the whole model, and rank 0
// writes every result in input order.
//
// Input line: {"prompt": TEXT} or {"input_ids": [ids]} (models without a tokenizer), and optionally
// max_new_tokens, temperature (0 = greedy), top_k, top_p, repetition_penalty, seed, stop (a string
// or a list), stop_token_ids, ignore_eos (the tokenizer's EOS, which ends generation by default).
// Output line: {"index", "output_ids", "text" (with a tokenizer; cut before a stop string),
// "finish_reason" ("stop" | "length"), "prompt_tokens", "completion_tokens",
// "time_to_first_token_ms", "total_ms"}.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/sampling.h"
#include "runtime/generation_engine.h"
#include "runtime/inference_model.h"

namespace zp::app {

// What a request leaves unsaid (the command's options).
struct SamplingDefaults {
  int64_t max_new_tokens = 256;
  kernels::SamplingParams params;  // its draw is the scheduler's
};

struct GenerateOptions {
  runtime::InferenceModelOptions model;
  std::string prompts, out;
  std::string metrics_file;  // JSONL per step and a summary; ranks other than 0 append ".<rank>"
  SamplingDefaults defaults;
  runtime::GenerationOptions engine;
  bool print_progress = true;
};

// A JSONL record -> a request; `where` (FILE:LINE) starts every error. Unknown keys are errors
// (a misspelt "temprature" must not silently mean greedy).
runtime::GenerationRequest parse_generation_record(const nlohmann::json& record, const std::string& where,
                                                   const runtime::InferenceModel& model, const SamplingDefaults& d);

// Text of generated ids: special tokens left out, cut before the first stop string.
std::string completion_text(const io::BpeTokenizer& tokenizer, const std::vector<int32_t>& ids,
                            const std::vector<std::string>& stop_strings);

// Runs the job; returns 0. Throws zp::Error for bad input (naming FILE:LINE).
int run_generate(const GenerateOptions& o);

}  // namespace zp::app
