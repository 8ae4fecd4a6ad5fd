// What a generation job reports (issue 13, telemetry): one JSON line per step in the metrics file
// (new prompt and decode tokens, running and waiting sequences, KV blocks in use, the step's time)
// and a summary: time to first token and ms per output token over the requests (median and 90th
// percentile), tokens/s in and out, mean batch occupancy, preemptions (and how many were swapped to
// host memory), peak KV blocks and, for a streamed model, the weights' host-to-device bandwidth.
#pragma once
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/generation_engine.h"

namespace zp::runtime {

struct GenerationSummary {
  int64_t requests = 0, prompt_tokens = 0, generated_tokens = 0, steps = 0, preemptions = 0;
  int64_t swaps = 0;  // preemptions resumed from the KV swap space instead of recomputed
  double seconds = 0, tokens_per_s = 0, prefill_tokens_per_s = 0, occupancy = 0;
  double ttft_p50_ms = 0, ttft_p90_ms = 0, tpot_p50_ms = 0, tpot_p90_ms = 0;  // time per output token after the first
  int64_t peak_kv_blocks = 0, kv_blocks = 0;
  double weight_stream_gbs = 0;  // streamed weights' bytes per second (0: resident weights)
  nlohmann::json to_json() const;
  std::string line() const;  // the human-readable form
};

// `streamed_bytes_per_forward`: bytes a forward copies up (a streamed model's weights), else 0.
GenerationSummary summarize_generation(const GenerationEngine& engine, const std::vector<int64_t>& ids,
                                       double seconds, int64_t streamed_bytes_per_forward);

// The metrics JSONL of a generation job ("" = none); one line per step, then the summary.
class GenerationMetrics {
 public:
  explicit GenerationMetrics(const std::string& path);
  void step(const GenerationEngine& engine, double ms);
  void summary(const GenerationSummary& s);

 private:
  std::ofstream out_;
  GenerationStats last_;
};

}  // namespace zp::runtime
