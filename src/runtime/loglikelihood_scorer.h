// Scores loglikelihood requests with a Transformer, as lm-evaluation-harness's _loglikelihood_tokens
// does: each request's input is the last max_length + 1 tokens of context + continuation minus the
// final one (runtime/lm_evaluation.h's model_input); requests are sorted longest first (ties by their
// tokens) so that batches hold sequences of similar length, batched right-padded under a token budget
// (rows x the batch's longest input <= max_batch_tokens; a longer single request runs alone), and
// the results are put back in request order. Per token, -log p comes from the fused cross-entropy
// kernel straight from the logits; the sum runs in double on the host. is_greedy compares each
// continuation token with the argmax of its row of logits (copied to the host; the lowest index wins
// ties), as the harness's greedy_tokens == cont_toks.
//
// Right padding with a causal mask leaves every real position's logits those of the unpadded
// sequence (padding comes after them), so a request's score does not depend on its batch-mates up to
// the rounding of the matrix products at another batch shape.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "models/transformer.h"
#include "runtime/lm_evaluation.h"

namespace zp::runtime {

class LoglikelihoodScorer {
 public:
  // max_length: the model's context (<= its max_positions). max_batch_tokens: the budget of padded
  // input tokens per forward.
  LoglikelihoodScorer(models::Transformer& model, StreamHandle s, int64_t max_length, int64_t max_batch_tokens);

  std::vector<LoglikelihoodResult> score(const std::vector<LoglikelihoodRequest>& requests);
  // The number of forward calls so far (for tests and the progress line).
  int64_t forwards() const { return forwards_; }
  // Called before each forward (a streamed model's InferenceModel::begin_forward).
  void set_before_forward(std::function<void()> f) { before_forward_ = std::move(f); }

 private:
  void score_batch(const std::vector<const LoglikelihoodRequest*>& batch, std::vector<LoglikelihoodResult*>& out);

  models::Transformer& model_;
  StreamHandle s_;
  std::function<void()> before_forward_;
  int64_t max_length_, max_batch_tokens_, forwards_ = 0;
};

}  // namespace zp::runtime
