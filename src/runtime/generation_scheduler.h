// Continuous batching for generation (issue 13): which sequences run in the next step and where
// their keys and values go in the paged KV cache. Host logic only, no model: the engine
// (runtime/generation_engine.h) runs the plan and hands back one sampled token per sequence.
//
// Each step every running sequence decodes one token, and waiting requests join, first come first
// served, while the step stays within the token budget (their whole prompts are prefilled at once;
// the first prefill of a step is admitted whatever its length, so a long prompt is never starved),
// the sequence limit, and the free cache blocks. A sequence leaves at token granularity, the moment
// it finishes, and its blocks serve the next joiner. When a running sequence needs a new block and
// none is free, the most recently admitted one is preempted: its blocks are freed and it goes back
// to the front of the queue. With swap space (GenerationLimits::host_blocks) its keys and values
// are copied to host blocks first (the step's swap_out), and when it returns they are copied back
// (swap_in) and it goes on decoding where it stopped; without room there, the tokens it generated
// are prefilled again when it returns (recomputation, as vLLM does). Sampling draws are counted per
// request (kernels/sampling.h), so a preempted request samples the same tokens it would have otherwise.
#pragma once
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "io/bpe_tokenizer.h"
#include "kernels/sampling.h"
#include "nn/paged_kv_cache.h"

namespace zp::runtime {

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids, at least one
  int64_t max_new_tokens = 256;
  kernels::SamplingParams sampling;       // its `draw` is ignored: the scheduler counts draws
  std::vector<int32_t> stop_tokens;       // generation ends with one of them (kept in the output)
  std::vector<std::string> stop_strings;  // ... or when the output text contains one (needs a tokenizer)
};

enum class FinishReason : uint8_t { None, Stop, Length };
const char* finish_reason_name(FinishReason r);  // "", "stop", "length"

struct GenerationLimits {
  int64_t block_size = 16;        // tokens per cache block
  int64_t num_blocks = 0;         // blocks in the cache
  int64_t max_batch_tokens = 8192;  // new tokens per step (prefill budget; decodes count one each)
  int64_t max_seqs = 256;         // sequences running at once
  int64_t max_positions = 0;      // the model's context: a sequence stops ("length") when it is full
  int64_t host_blocks = 0;        // swap space for preempted sequences' blocks (0: recompute them)
};

// One step's work in host arrays, in CachedBatch's layout (nn/paged_kv_cache.h): the prefill
// sequences' tokens first, then one token per decoding sequence.
struct StepPlan {
  std::vector<int64_t> seqs;  // request ids, in output-row order (prefills, then decodes)
  int64_t num_prefill_seqs = 0;
  std::vector<int32_t> ids, positions, slots, segments;
  std::vector<int32_t> block_tables, context_lens, query_starts;  // the decode part
  int64_t max_blocks = 0, max_context_len = 0;
  std::vector<int32_t> output_rows;
  std::vector<kernels::SamplingParams> sampling;  // per output row, with the right draw
  std::vector<int32_t> history;                   // repetition penalty: each row's prompt + output
  std::vector<int64_t> history_starts;            // empty when no row has a penalty
  // Block copies to make before the step's forward, in this order: preempted sequences' blocks to
  // the host, then returning sequences' blocks back (nn::PagedKvCache::swap).
  std::vector<nn::BlockCopy> swap_out, swap_in;
  int64_t num_tokens() const { return int64_t(ids.size()); }
  int64_t num_prefill_tokens() const { return int64_t(segments.size()); }
  bool empty() const { return seqs.empty(); }
};

class GenerationScheduler {
 public:
  // tokenizer: for stop strings (may be nullptr when no request has any).
  GenerationScheduler(const GenerationLimits& limits, const io::BpeTokenizer* tokenizer = nullptr);

  // Queues a request and returns its id (0, 1, 2, ... in submission order). Throws zp::Error for a
  // request that can never run: an empty prompt, a prompt that fills the model's context, or one
  // that needs more cache blocks than the whole cache has.
  int64_t submit(GenerationRequest request);
  // The next step (empty when nothing is waiting or running).
  StepPlan plan();
  // The tokens sampled for plan's output rows, in order. Returns the ids of the requests that
  // finished in this step.
  std::vector<int64_t> commit(const StepPlan& plan, const std::vector<int32_t>& tokens);

  bool idle() const { return waiting_.empty() && running_.empty(); }
  const GenerationRequest& request(int64_t id) const { return seqs_[size_t(id)].req; }
  const std::vector<int32_t>& output(int64_t id) const { return seqs_[size_t(id)].output; }
  FinishReason finish_reason(int64_t id) const { return seqs_[size_t(id)].finish; }
  int64_t running() const { return int64_t(running_.size()); }
  int64_t waiting() const { return int64_t(waiting_.size()); }
  int64_t free_blocks() const { return int64_t(free_.size()); }
  int64_t free_host_blocks() const { return int64_t(free_host_.size()); }
  // Sequences preempted so far, and how many of those went to the swap space (the rest are recomputed).
  int64_t preemptions() const { return preemptions_; }
  int64_t swaps() const { return swaps_; }
  const GenerationLimits& limits() const { return lim_; }

 private:
  struct Seq {
    GenerationRequest req;
    std::vector<int32_t> output;
    std::vector<int32_t> blocks;
    std::vector<int32_t> host_blocks;  // while swapped out: where its blocks' keys and values are
    int64_t cached = 0;  // tokens whose keys and values are in the cache (or swapped out)
    FinishReason finish = FinishReason::None;
    std::string text;  // the output's bytes so far, special tokens included (stop strings)
    int64_t length() const { return int64_t(req.prompt.size() + output.size()); }
    int32_t token_at(int64_t p) const {
      return p < int64_t(req.prompt.size()) ? req.prompt[size_t(p)] : output[size_t(p) - req.prompt.size()];
    }
  };
  int64_t blocks_for(int64_t tokens) const { return (tokens + lim_.block_size - 1) / lim_.block_size; }
  void release(Seq& s);
  // Preempts the most recently admitted sequence; its swap-out copies go to `swap_out`.
  void preempt_last(std::vector<nn::BlockCopy>& swap_out);
  bool check_stop(Seq& s, int32_t token);

  GenerationLimits lim_;
  const io::BpeTokenizer* tok_;
  std::vector<Seq> seqs_;
  std::deque<int64_t> waiting_;
  std::vector<int64_t> running_;  // in admission order
  std::vector<int32_t> free_;     // free block ids (a stack: the last freed is reused first)
  std::vector<int32_t> free_host_;  // free swap-space blocks, likewise
  std::vector<int64_t> ended_in_plan_;  // reported by the next commit
  int64_t preemptions_ = 0, swaps_ = 0;
};

}  // namespace zp::runtime
