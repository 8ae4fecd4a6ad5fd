#include "runtime/generation_scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace zp::runtime {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    default: return "";
  }
}

GenerationScheduler::GenerationScheduler(const GenerationLimits& limits, const io::BpeTokenizer* tokenizer)
    : lim_(limits), tok_(tokenizer) {
  ZP_REQUIRE(lim_.block_size > 0 && lim_.num_blocks > 0, "generation: the KV cache needs at least one block");
  ZP_REQUIRE(lim_.max_batch_tokens > 0 && lim_.max_seqs > 0 && lim_.max_positions > 0,
             "generation: max_batch_tokens, max_seqs and the model's positions must be positive");
  free_.resize(size_t(lim_.num_blocks));
  // A stack popped from the back: block 0 is handed out first.
  for (int64_t b = 0; b < lim_.num_blocks; ++b) free_[size_t(b)] = int32_t(lim_.num_blocks - 1 - b);
  ZP_REQUIRE(lim_.host_blocks >= 0, "generation: host_blocks must be >= 0, got ", lim_.host_blocks);
  free_host_.resize(size_t(lim_.host_blocks));
  for (int64_t b = 0; b < lim_.host_blocks; ++b) free_host_[size_t(b)] = int32_t(lim_.host_blocks - 1 - b);
}

int64_t GenerationScheduler::submit(GenerationRequest r) {
  const int64_t id = int64_t(seqs_.size());
  ZP_REQUIRE(!r.prompt.empty(), "request ", id, ": an empty prompt (at least one token is needed)");
  ZP_REQUIRE(int64_t(r.prompt.size()) <= lim_.max_positions, "request ", id, ": the prompt's ", r.prompt.size(),
             " tokens exceed the model's ", lim_.max_positions, " positions");
  ZP_REQUIRE(blocks_for(int64_t(r.prompt.size())) <= lim_.num_blocks, "request ", id, ": the prompt's ",
             r.prompt.size(), " tokens need more than the KV cache's ", lim_.num_blocks, " blocks of ",
             lim_.block_size, " tokens (give the cache more memory)");
  ZP_REQUIRE(r.max_new_tokens >= 1, "request ", id, ": max_new_tokens must be at least 1, got ", r.max_new_tokens);
  ZP_REQUIRE(r.stop_strings.empty() || tok_, "request ", id, ": stop strings need a tokenizer");
  for (const std::string& s : r.stop_strings) ZP_REQUIRE(!s.empty(), "request ", id, ": an empty stop string");
  // Checked here: the CUDA sampler reads the settings on the device and cannot.
  kernels::check_sampling_params(r.sampling);
  Seq s;
  s.req = std::move(r);
  seqs_.push_back(std::move(s));
  waiting_.push_back(id);
  return id;
}

void GenerationScheduler::release(Seq& s) {
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) free_.push_back(*it);
  s.blocks.clear();
  s.cached = 0;
}

void GenerationScheduler::preempt_last(std::vector<nn::BlockCopy>& swap_out) {
  const int64_t id = running_.back();
  running_.pop_back();
  Seq& s = seqs_[size_t(id)];
  if (!s.blocks.empty() && s.blocks.size() <= free_host_.size()) {
    // Its keys and values go to the swap space; the device blocks are free once the copies are
    // enqueued, which the step does before anything writes into them.
    for (int32_t d : s.blocks) {
      s.host_blocks.push_back(free_host_.back());
      free_host_.pop_back();
      swap_out.push_back({d, s.host_blocks.back()});
    }
    const int64_t cached = s.cached;
    release(s);
    s.cached = cached;
    ++swaps_;
  } else {
    release(s);
  }
  waiting_.push_front(id);
  ++preemptions_;
}

StepPlan GenerationScheduler::plan() {
  StepPlan p;
  // Every running sequence decodes one token at position `cached`; one that starts a new block
  // needs a free one, and the newest sequences give theirs up until there are enough.
  auto needs_block = [&](const Seq& s) { return s.cached >= int64_t(s.blocks.size()) * lim_.block_size; };
  for (;;) {
    int64_t need = 0;
    for (int64_t id : running_) need += needs_block(seqs_[size_t(id)]) ? 1 : 0;
    if (need <= int64_t(free_.size())) break;
    if (running_.size() == 1) {
      // One sequence alone has outgrown the whole cache: it ends here.
      Seq& s = seqs_[size_t(running_[0])];
      s.finish = FinishReason::Length;
      release(s);
      ended_in_plan_.push_back(running_[0]);
      running_.clear();
      break;
    }
    preempt_last(p.swap_out);
  }
  std::vector<int64_t> decodes = running_;
  for (int64_t id : decodes) {
    Seq& s = seqs_[size_t(id)];
    if (needs_block(s)) {
      s.blocks.push_back(free_.back());
      free_.pop_back();
    }
  }
  // Waiting requests join in order while the budgets allow.
  int64_t tokens = int64_t(decodes.size());
  std::vector<int64_t> prefills;
  while (!waiting_.empty() && int64_t(running_.size()) < lim_.max_seqs) {
    Seq& s = seqs_[size_t(waiting_.front())];
    if (!s.host_blocks.empty()) {
      // A swapped-out sequence: its blocks come back and it decodes its next token in this step
      // (one more block if that token starts one). A sequence preempted in this plan never fits
      // here: what it freed went to the decodes that needed more than was free.
      const int64_t back = int64_t(s.host_blocks.size());
      const int64_t need = back + (s.cached >= back * lim_.block_size ? 1 : 0);
      if (need > int64_t(free_.size()) || tokens + 1 > lim_.max_batch_tokens) break;
      for (int32_t h : s.host_blocks) {
        s.blocks.push_back(free_.back());
        free_.pop_back();
        p.swap_in.push_back({s.blocks.back(), h});
      }
      // Free for later plans: this step's copies are enqueued before the next step's.
      for (auto it = s.host_blocks.rbegin(); it != s.host_blocks.rend(); ++it) free_host_.push_back(*it);
      s.host_blocks.clear();
      if (need > back) {
        s.blocks.push_back(free_.back());
        free_.pop_back();
      }
      tokens += 1;
      decodes.push_back(waiting_.front());
      running_.push_back(waiting_.front());
      waiting_.pop_front();
      continue;
    }
    const int64_t L = s.length(), need = blocks_for(L);
    if (need > int64_t(free_.size())) break;
    if (!prefills.empty() && tokens + L > lim_.max_batch_tokens) break;
    for (int64_t i = 0; i < need; ++i) {
      s.blocks.push_back(free_.back());
      free_.pop_back();
    }
    tokens += L;
    prefills.push_back(waiting_.front());
    running_.push_back(waiting_.front());
    waiting_.pop_front();
  }

  auto slot_of = [&](const Seq& s, int64_t pos) {
    return s.blocks[size_t(pos / lim_.block_size)] * int32_t(lim_.block_size) + int32_t(pos % lim_.block_size);
  };
  p.num_prefill_seqs = int64_t(prefills.size());
  for (size_t k = 0; k < prefills.size(); ++k) {
    Seq& s = seqs_[size_t(prefills[k])];
    const int64_t L = s.length();
    for (int64_t t = 0; t < L; ++t) {
      p.ids.push_back(s.token_at(t));
      p.positions.push_back(int32_t(t));
      p.slots.push_back(slot_of(s, t));
      p.segments.push_back(int32_t(k));
    }
    p.output_rows.push_back(int32_t(p.ids.size() - 1));
    p.seqs.push_back(prefills[k]);
    s.cached = L;
  }
  for (int64_t id : decodes) {
    const Seq& s = seqs_[size_t(id)];
    p.max_blocks = std::max(p.max_blocks, int64_t(s.blocks.size()));
  }
  p.query_starts.push_back(0);
  for (int64_t id : decodes) {
    Seq& s = seqs_[size_t(id)];
    const int64_t pos = s.cached;
    p.output_rows.push_back(int32_t(p.ids.size()));
    p.ids.push_back(s.token_at(pos));
    p.positions.push_back(int32_t(pos));
    p.slots.push_back(slot_of(s, pos));
    for (int64_t j = 0; j < p.max_blocks; ++j)
      p.block_tables.push_back(j < int64_t(s.blocks.size()) ? s.blocks[size_t(j)] : 0);
    p.context_lens.push_back(int32_t(pos + 1));
    p.query_starts.push_back(p.query_starts.back() + 1);
    p.max_context_len = std::max(p.max_context_len, pos + 1);
    p.seqs.push_back(id);
    s.cached = pos + 1;
  }
  bool penalty = false;
  for (int64_t id : p.seqs) {
    const Seq& s = seqs_[size_t(id)];
    kernels::SamplingParams sp = s.req.sampling;
    sp.draw = uint64_t(s.output.size());
    p.sampling.push_back(sp);
    penalty = penalty || sp.repetition_penalty != 1.f;
  }
  if (penalty) {
    p.history_starts.push_back(0);
    for (int64_t id : p.seqs) {
      const Seq& s = seqs_[size_t(id)];
      p.history.insert(p.history.end(), s.req.prompt.begin(), s.req.prompt.end());
      p.history.insert(p.history.end(), s.output.begin(), s.output.end());
      p.history_starts.push_back(int64_t(p.history.size()));
    }
  }
  return p;
}

bool GenerationScheduler::check_stop(Seq& s, int32_t token) {
  if (std::find(s.req.stop_tokens.begin(), s.req.stop_tokens.end(), token) != s.req.stop_tokens.end()) {
    s.finish = FinishReason::Stop;
    return true;
  }
  if (!s.req.stop_strings.empty()) {
    const size_t before = s.text.size();
    s.text += tok_->token_bytes(token);
    // A stop string may straddle tokens: search from where one ending in the new bytes could start.
    size_t first = std::string::npos;
    for (const std::string& stop : s.req.stop_strings) {
      const size_t from = before >= stop.size() - 1 ? before - (stop.size() - 1) : 0;
      const size_t at = s.text.find(stop, from);
      if (at != std::string::npos) first = std::min(first, at);
    }
    if (first != std::string::npos) {
      s.finish = FinishReason::Stop;
      return true;
    }
  }
  if (int64_t(s.output.size()) >= s.req.max_new_tokens || s.length() > lim_.max_positions) {
    s.finish = FinishReason::Length;
    return true;
  }
  return false;
}

std::vector<int64_t> GenerationScheduler::commit(const StepPlan& p, const std::vector<int32_t>& tokens) {
  ZP_CHECK(tokens.size() == p.seqs.size(), "commit: ", tokens.size(), " tokens for ", p.seqs.size(), " rows");
  std::vector<int64_t> done = std::move(ended_in_plan_);
  ended_in_plan_.clear();
  for (size_t r = 0; r < p.seqs.size(); ++r) {
    Seq& s = seqs_[size_t(p.seqs[r])];
    if (s.finish != FinishReason::None) continue;  // ended by the cache in plan()
    s.output.push_back(tokens[r]);
    if (!check_stop(s, tokens[r])) continue;
    release(s);
    running_.erase(std::find(running_.begin(), running_.end(), p.seqs[r]));
    done.push_back(p.seqs[r]);
  }
  return done;
}

}  // namespace zp::runtime
