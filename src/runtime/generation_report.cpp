#include "runtime/generation_report.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"

namespace zp::runtime {

namespace {

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5))];
}

}  // namespace

GenerationSummary summarize_generation(const GenerationEngine& engine, const std::vector<int64_t>& ids,
                                       double seconds, int64_t streamed_bytes_per_forward) {
  GenerationSummary s;
  const GenerationStats& st = engine.stats();
  std::vector<double> ttft, tpot;
  for (int64_t id : ids) {
    const GenerationOutput o = engine.output(id);
    ++s.requests;
    s.prompt_tokens += o.prompt_tokens;
    s.generated_tokens += int64_t(o.ids.size());
    ttft.push_back(o.first_token_ms);
    if (o.ids.size() > 1) tpot.push_back((o.total_ms - o.first_token_ms) / double(o.ids.size() - 1));
  }
  s.steps = st.steps;
  s.preemptions = st.preemptions;
  s.swaps = st.swaps;
  s.seconds = seconds;
  s.tokens_per_s = double(s.generated_tokens) / std::max(seconds, 1e-9);
  s.prefill_tokens_per_s = st.prefill_step_ms > 0 ? double(st.prefill_tokens) / (st.prefill_step_ms / 1e3) : 0;
  s.occupancy = st.steps ? st.occupancy_sum / double(st.steps) : 0;
  s.ttft_p50_ms = percentile(ttft, 0.5);
  s.ttft_p90_ms = percentile(ttft, 0.9);
  s.tpot_p50_ms = percentile(tpot, 0.5);
  s.tpot_p90_ms = percentile(tpot, 0.9);
  s.peak_kv_blocks = st.peak_blocks_used;
  s.kv_blocks = engine.cache_blocks();
  if (streamed_bytes_per_forward > 0)
    s.weight_stream_gbs = double(streamed_bytes_per_forward) * double(st.steps) / std::max(seconds, 1e-9) / 1e9;
  return s;
}

nlohmann::json GenerationSummary::to_json() const {
  return {{"event", "summary"},          {"requests", requests},
          {"prompt_tokens", prompt_tokens}, {"generated_tokens", generated_tokens},
          {"steps", steps},                {"seconds", seconds},
          {"tokens_per_s", tokens_per_s},  {"prefill_tokens_per_s", prefill_tokens_per_s},
          {"batch_occupancy", occupancy},  {"preemptions", preemptions},
          {"swapped_preemptions", swaps},
          {"ttft_p50_ms", ttft_p50_ms},    {"ttft_p90_ms", ttft_p90_ms},
          {"tpot_p50_ms", tpot_p50_ms},    {"tpot_p90_ms", tpot_p90_ms},
          {"peak_kv_blocks", peak_kv_blocks}, {"kv_blocks", kv_blocks},
          {"weight_stream_GBps", weight_stream_gbs}};
}

std::string GenerationSummary::line() const {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%lld requests: %lld prompt + %lld generated tokens in %.2f s, %.0f generated tokens/s, prefill "
                "%.0f tokens/s; time to first token p50 %.1f ms (p90 %.1f), per output token p50 %.2f ms (p90 %.2f); "
                "%lld steps, batch occupancy %.0f%%, %lld preemptions (%lld swapped to host memory), KV blocks "
                "peak %lld/%lld",
                (long long)requests, (long long)prompt_tokens, (long long)generated_tokens, seconds, tokens_per_s,
                prefill_tokens_per_s, ttft_p50_ms, ttft_p90_ms, tpot_p50_ms, tpot_p90_ms, (long long)steps,
                100.0 * occupancy, (long long)preemptions, (long long)swaps, (long long)peak_kv_blocks,
                (long long)kv_blocks);
  std::string s = buf;
  if (weight_stream_gbs > 0) {
    std::snprintf(buf, sizeof buf, "; weights streamed at %.1f GB/s", weight_stream_gbs);
    s += buf;
  }
  return s;
}

GenerationMetrics::GenerationMetrics(const std::string& path) {
  if (path.empty()) return;
  out_.open(path, std::ios::out | std::ios::trunc);
  ZP_REQUIRE(out_, path, ": cannot open the metrics file for writing");
}

void GenerationMetrics::step(const GenerationEngine& e, double ms) {
  if (!out_.is_open()) return;
  const GenerationStats& st = e.stats();
  const nlohmann::json j = {{"event", "generate_step"},
                            {"step", st.steps},
                            {"prefill_tokens", st.prefill_tokens - last_.prefill_tokens},
                            {"decode_tokens", st.decode_tokens - last_.decode_tokens},
                            {"running", e.scheduler().running()},
                            {"waiting", e.scheduler().waiting()},
                            {"kv_blocks_used", e.cache_blocks() - e.scheduler().free_blocks()},
                            {"preemptions", st.preemptions},
                            {"swapped_preemptions", st.swaps},
                            {"swapped_out_blocks", st.swapped_out_blocks - last_.swapped_out_blocks},
                            {"swapped_in_blocks", st.swapped_in_blocks - last_.swapped_in_blocks},
                            {"ms", ms}};
  out_ << j.dump() << '\n';
  last_ = st;
}

void GenerationMetrics::summary(const GenerationSummary& s) {
  if (!out_.is_open()) return;
  out_ << s.to_json().dump() << '\n';
  out_.flush();
  ZP_REQUIRE(out_, "the metrics file could not be written (disk full?)");
}

}  // namespace zp::runtime
