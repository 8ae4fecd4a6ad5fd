// Choosing the next token from a model's logits (generation, issue 13), as Hugging Face's generate
// processes them, in its order: repetition penalty, then temperature, top-k, top-p; then greedy
// (temperature 0) or one draw from the softmax. The one non-obvious part is the draw: it is the
// inverse CDF, in vocabulary order, of the kept tokens' probabilities at one uniform number
// u = hash(seed, draw) (a counter-based hash, no RNG state), so a request's tokens depend on its seed
// and on how many tokens it has drawn, never on the batch it happened to run in.
//
//   logits[S, ld] (dtype dt): row r holds V real columns, then ld - V padding columns that are never
//   chosen. The rows are processed in place (the penalty and temperature change them).
#pragma once
#include "kernels/kernel.h"

namespace zp::kernels {

// One row's settings (HF's GenerationConfig names).
struct SamplingParams {
  float temperature = 0.f;         // 0: greedy, the highest logit (the lowest index among equal ones)
  int32_t top_k = 0;               // 0: off; else keep the logits >= the k-th largest (ties kept, as HF)
  float top_p = 1.f;               // 1: off; else keep the most probable tokens whose mass reaches top_p
                                   // (at least one; tokens of equal probability are kept or dropped together)
  float repetition_penalty = 1.f;  // 1: off; else each token in the row's history: l > 0 ? l / p : l * p
  uint64_t seed = 0;
  uint64_t draw = 0;               // which draw of this request (the number of tokens it has drawn so far)
};

// The counter-based uniform number in [0, 1) the draw of (seed, draw) uses; the CPU and CUDA sample
// with exactly this value.
double sampling_uniform(uint64_t seed, uint64_t draw);

// tokens[r] (int32 [S]) = the token chosen for row r under params[r] (SamplingParams [S]).
// history: int32 token ids, row r's being history[history_starts[r] .. history_starts[r+1]) (int64
// [S+1]); a token may appear several times (penalised once). history and history_starts may be
// nullptr when no row has a penalty. logprobs (fp32 [S], may be nullptr) = log softmax of the row's
// logits as they came in (before any processing) at the chosen token.
// Every array is on the logits' device.
ZP_KERNEL(void sample_tokens(StreamHandle s, DType dt, int32_t* tokens, float* logprobs, void* logits, int64_t S,
                             int64_t V, int64_t ld, const SamplingParams* params, const int32_t* history,
                             const int64_t* history_starts))

}  // namespace zp::kernels
