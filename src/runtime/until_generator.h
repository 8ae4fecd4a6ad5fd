// Greedy generation for `zeropipe eval`'s generate_until tasks, through the continuous-batching
// engine (runtime/generation_engine.h): every ask is one request, all of them in flight together.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "io/bpe_tokenizer.h"
#include "models/transformer.h"
#include "runtime/lm_evaluation.h"

namespace zp::runtime {

// For each ask: greedy tokens (the lowest id among equal maxima) until the tokenizer's EOS comes, a
// stop string appears in the generated text, max_new_tokens are made, or the context and what was
// made fill max_length. Returns the generated texts, special tokens and the EOS left out (the
// harness's tok_decode). before_forward: as GenerationEngine::set_before_forward (a streamed model).
std::vector<std::string> generate_greedy_until(models::Transformer& model, const io::BpeTokenizer& tok,
                                               int64_t max_length, const std::vector<GenerationAsk>& asks,
                                               const std::function<void()>& before_forward = {});

}  // namespace zp::runtime
