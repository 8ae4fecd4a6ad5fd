// Greedy generation for `zeropipe eval`'s generate_until tasks by re-running the whole forward for
// every new token: no KV cache, so each step costs a full prefill. Simple and obviously right, and
// slow; the continuous-batching generator with the paged KV cache (issue 13, item 3) replaces it.
#pragma once
#include <string>
#include <vector>

#include "io/bpe_tokenizer.h"
#include "models/transformer.h"
#include "runtime/lm_evaluation.h"

namespace zp::runtime {

// For each ask, in turn: append the argmax token (lowest id on ties) of the last position's logits
// until the tokenizer's EOS comes, a stop string appears in the decoded generated text, max_new_tokens
// are made, or the sequence would pass max_length. Returns the generated texts, special tokens left
// out (the harness's tok_decode).
std::vector<std::string> generate_greedy_reforward(models::Transformer& model, StreamHandle s,
                                                   const io::BpeTokenizer& tok, int64_t max_length,
                                                   const std::vector<GenerationAsk>& asks);

}  // namespace zp::runtime
