// Choosing the next token from a model's logits (generation, issue 13), as Hugging Face's generate
// processes them, in its order: repetition penalty, then temperature, top-k, top-p; then greedy
// (temperature 0) or one draw from the softmax. The one non-obvious part is the draw: it is the
// inverse CDF, in vocabulary order, of the kept tokens' probabilities at one uniform number
// u = hash(seed, draw) (a counter-based hash, no RNG state), so a request's tokens depend on its seed
// and on how many tokens it has drawn, never on the batch it happened to run in.
//
//   logits[S, ld] (dtype dt): row r holds V real columns, then ld - V padding columns that are never
//   chosen. The pointer is not const so that a backend may process the rows in place; neither does
//   today (both apply the penalty and temperature on the fly, in fp64 on the CPU and fp32 on CUDA,
//   which also keeps the raw row for the logprobs), but callers should treat the rows as consumed.
//
// Top-p and ties: HF's TopPLogitsWarper sorts ascending and removes the tokens whose ascending
// cumulative probability is <= 1 - top_p, i.e. it removes the largest low-probability prefix whose mass
// is <= 1 - top_p, which keeps the smallest high-probability set whose mass is >= top_p: the set kept
// here. The two differ only where HF's sort splits a run of equal probabilities at the boundary (its
// order among equals is arbitrary; here the whole run stays or goes) and where the mass lands within
// rounding of top_p: HF compares fp32 sums with 1 - top_p; here the mass reaches top_p when it is
// >= top_p - kTopPSlack, so that a top_p such as 0.8 over probabilities that add up to 0.8 keeps them
// however the float 0.8f and the sums round (fp64 sums on the CPU, exact integer sums on CUDA).
#pragma once
#include <span>

#include "kernels/kernel.h"

namespace zp::kernels {

inline constexpr double kTopPSlack = 1e-6;
// How many of the most probable tokens the CPU's top-p sorts first (cpu::top_p_threshold): a
// language model's kept set is usually smaller, and then 128k tokens cost ~5x less than sorted whole
// (BM_TopPCpu); a larger kept set costs up to ~1.3x a full sort.
inline constexpr int64_t kTopPCandidates = 1024;

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

// Throws zp::Error unless temperature >= 0, top_k >= 0, 0 < top_p <= 1 and repetition_penalty > 0.
// The CPU reference checks every row; the CUDA version cannot (params are on the device), so a caller
// checks its requests before they are uploaded.
void check_sampling_params(const SamplingParams& p);

// The counter-based uniform number in [0, 1) the draw of (seed, draw) uses; the CPU and CUDA sample
// with exactly this value.
double sampling_uniform(uint64_t seed, uint64_t draw);

// tokens[r] (int32 [S]) = the token chosen for row r under params[r] (SamplingParams [S]).
// history: int32 token ids, row r's being history[history_starts[r] .. history_starts[r+1]) (int64
// [S+1]); a token may appear several times (penalised once). history and history_starts may be
// nullptr when no row has a penalty. A history token outside [0, V) is fatal (ZP_CHECK) on the CPU
// and ignored on CUDA (which cannot report it); the CPU also throws for a row's bad params. logprobs (fp32 [S], may be nullptr) = log softmax of the row's
// logits as they came in (before any processing) at the chosen token.
// Every array is on the logits' device.
namespace cpu {
// The CPU's top-p threshold over the kept tokens' unnormalised weights (any order; z their sum): the
// weight of the lightest run of equal weights that the walk from the heaviest down keeps (see the
// top). `candidates`: how many of the heaviest to sort first; the result is the same for every value
// (the full sort's), only the cost differs.
double top_p_threshold(std::span<const double> kept_weights, double z, float top_p, int64_t candidates);
}  // namespace cpu

ZP_KERNEL(void sample_tokens(StreamHandle s, DType dt, int32_t* tokens, float* logprobs, void* logits, int64_t S,
                             int64_t V, int64_t ld, const SamplingParams* params, const int32_t* history,
                             const int64_t* history_starts))

}  // namespace zp::kernels
