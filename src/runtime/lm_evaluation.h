// Language-model evaluation with lm-evaluation-harness's semantics (issue 13, item 5): how requests
// are built from task documents, how they are scored, and how the scores become metrics and a
// results JSON shaped like the harness's. The rules, as the harness (lm_eval/api/model.py,
// models/huggingface.py, utils.py, api/task.py, api/metrics.py) applies them:
//
//  - multiple_choice: one loglikelihood request per choice, continuation = target_delimiter + choice.
//    acc: the choice with the largest summed log-probability (the first on ties, as np.argmax);
//    acc_norm: the largest summed log-probability divided by the choice's length in characters
//    (Unicode code points of the choice alone, without the delimiter: Python's len(choice)).
//  - request encoding (_encode_pair): the context's trailing whitespace (Python's str.rstrip) moves to
//    the front of the continuation; context + continuation is encoded whole, and the continuation's
//    tokens are whatever follows the encoded context's length. Texts are encoded with the tokenizer's
//    default special tokens (add_special_tokens=True: BOS for Llama 3, nothing for GPT-2) unless the
//    text already starts with the prefix token's text. An empty context: the continuation is encoded
//    without special tokens and the context is the prefix token (BOS, else EOS), or, when the
//    continuation already starts with that token, its first token.
//  - the model's input is the last max_length + 1 tokens of context + continuation without the final
//    one; the continuation's log-probabilities are read from the last len(continuation) positions.
//  - loglikelihood_rolling: the text's tokens in disjoint windows of max_length, the first after the
//    prefix token, each later one after one token of context (the last, shorter one after as many as
//    fill max_length): get_rolling_token_windows(context_len=1) + make_disjoint_window. Summed over
//    windows: word_perplexity = exp(-sum ll / sum words), byte_perplexity = exp(-sum ll / sum bytes),
//    bits_per_byte = -sum ll / sum bytes / ln 2, words as len(re.split(r"\s+", text)), bytes UTF-8.
//  - generate_until: the context left-truncated to max_length - max_gen_toks tokens, greedy
//    generation, the text cut at the first occurrence of each `until` string in turn (and of the EOS
//    token's text, which the harness appends); exact_match after the default take_first filter.
//  - stderr of a mean: sample standard deviation / sqrt(n) (mean_stderr); perplexities have none
//    ("N/A", as the harness writes for aggregations it cannot bootstrap).
//
// Under MPI, requests are dealt to ranks by index (request i to rank i % world); each rank scores its
// own and the results are gathered to rank 0, which computes the metrics. A request's score does not
// depend on which rank computes it.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "io/bpe_tokenizer.h"
#include "runtime/eval_tasks.h"

namespace zp::runtime {

// log P(continuation | context), in token ids. Both non-empty.
struct LoglikelihoodRequest {
  std::vector<int32_t> context, continuation;
};

struct LoglikelihoodResult {
  double logprob = 0;      // summed over the continuation's tokens
  bool is_greedy = false;  // every continuation token is the argmax at its position
};

// Scores requests (in any number, any order) and returns one result per request, in their order.
using ScoreLoglikelihood = std::function<std::vector<LoglikelihoodResult>(const std::vector<LoglikelihoodRequest>&)>;

// One greedy generation: continue `context` until a stop string appears in the generated text, the
// tokenizer's EOS is produced, or max_new_tokens tokens were made.
struct GenerationAsk {
  std::vector<int32_t> context;
  std::vector<std::string> until;
  int64_t max_new_tokens = 256;
};
// Returns the generated text of each ask (decoded without special tokens), in their order. The text
// may run past a stop string: the evaluation cuts it there.
using GreedyGenerate = std::function<std::vector<std::string>(const std::vector<GenerationAsk>&)>;

// ---- request building (the harness's rules above) ----

// The harness's prefix_token_id: BOS, else EOS; a zp::Error when the tokenizer has neither.
int32_t prefix_token(const io::BpeTokenizer& tok);
// tok_encode: the tokenizer's default special tokens, none when `text` starts with the prefix
// token's text.
std::vector<int32_t> harness_encode(const io::BpeTokenizer& tok, std::string_view text);
// loglikelihood's request for (context, continuation): _encode_pair, or the empty-context rule.
// A zp::Error (naming `where`) when the continuation or the context comes out without tokens.
LoglikelihoodRequest encode_loglikelihood(const io::BpeTokenizer& tok, std::string_view context,
                                          std::string_view continuation, const std::string& where = "");
// get_rolling_token_windows(tokens, prefix, max_length, context_len=1) + make_disjoint_window.
std::vector<LoglikelihoodRequest> rolling_windows(const std::vector<int32_t>& tokens, int32_t prefix,
                                                  int64_t max_length);
// The model's input: the last max_length + 1 tokens of context + continuation, without the final one.
std::vector<int32_t> model_input(const LoglikelihoodRequest& r, int64_t max_length);

// ---- text measures and statistics ----

// Python's str.rstrip() on UTF-8: `text` without its trailing whitespace (str.isspace characters).
std::string_view rstrip_whitespace(std::string_view text);
// Python's len(str): Unicode code points (an invalid byte counts as one).
int64_t utf8_characters(std::string_view text);
// len(re.split(r"\s+", text)): one more than the number of whitespace runs.
int64_t count_words(std::string_view text);
// mean_stderr: sample standard deviation / sqrt(n); NaN for fewer than two values.
double mean_stderr(const std::vector<double>& values);
// acc and acc_norm of one multiple-choice document: 1 when the argmax (first on ties) is gold.
struct ChoiceScores {
  double acc = 0, acc_norm = 0;
};
ChoiceScores score_choices(const std::vector<double>& logprobs, const std::vector<std::string>& choices, int64_t gold);

// ---- the evaluation ----

struct LmEvaluationOptions {
  int64_t max_length = 0;  // the model's context (max_positions, or --max-length)
  int64_t limit = -1;      // the first `limit` documents of each task; < 0: all
  // The results JSON's "config" object (model, dtype, device, batch settings), written as given.
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
};

// Builds every task's requests, scores them across the ranks of `comm` (each rank calls this with
// the same tasks and options), and returns the harness-shaped results on rank 0 (null elsewhere):
// results, group_subtasks, configs, versions, n-shot, higher_is_better, n-samples, config.
// `generate` may be empty when no task is generate_until. Every rank calls `score` and `generate`
// equally often, with no requests too (a rank of a sharded model then joins the others' forwards).
nlohmann::ordered_json evaluate_tasks(const std::vector<EvalTask>& tasks, const io::BpeTokenizer& tok,
                                      const LmEvaluationOptions& options, const ScoreLoglikelihood& score,
                                      const GreedyGenerate& generate, MPI_Comm comm);

// The harness's results table (make_table) as Markdown: Tasks, Version, Filter, n-shot, Metric,
// Value, Stderr.
std::string results_table(const nlohmann::ordered_json& results);

}  // namespace zp::runtime
