// Generation (issue 13): the continuous-batching scheduler's bookkeeping, the KV-cache forward
// against full re-forwards, and greedy generation against transformers' (tests/golden/*/generate.json,
// written by tests/reference/generate_reference.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/weight_source.h"
#include "models/transformer.h"
#include "runtime/generation_engine.h"
#include "runtime/generation_scheduler.h"
#include "runtime/inference_model.h"
#include "test_util.h"

namespace zp {
namespace {

using runtime::FinishReason;
using runtime::GenerationLimits;
using runtime::GenerationRequest;
using runtime::GenerationScheduler;
using runtime::StepPlan;

GenerationRequest request(int64_t prompt_len, int64_t max_new, int32_t first = 1) {
  GenerationRequest r;
  for (int64_t i = 0; i < prompt_len; ++i) r.prompt.push_back(first + int32_t(i));
  r.max_new_tokens = max_new;
  return r;
}

TEST(GenerationScheduler, PrefillsThenDecodesWithinTheTokenBudget) {
  GenerationScheduler s({/*block*/ 4, /*blocks*/ 16, /*tokens*/ 10, /*seqs*/ 8, /*positions*/ 64});
  s.submit(request(6, 3));
  s.submit(request(3, 3));
  s.submit(request(5, 3));
  // 6 + 3 fit the budget of 10; the third waits.
  StepPlan p = s.plan();
  ASSERT_EQ(p.seqs, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(p.num_prefill_seqs, 2);
  EXPECT_EQ(p.num_prefill_tokens(), 9);
  EXPECT_EQ(p.output_rows, (std::vector<int32_t>{5, 8}));
  EXPECT_EQ(p.segments, (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(p.positions[6], 0);
  // Request 0 holds blocks 0 and 1, request 1 block 2: slots follow.
  EXPECT_EQ(p.slots[5], 1 * 4 + 1);
  EXPECT_EQ(p.slots[6], 2 * 4 + 0);
  EXPECT_TRUE(s.commit(p, {100, 101}).empty());
  // Two decodes and the third prompt: 2 + 5 <= 10.
  p = s.plan();
  ASSERT_EQ(p.seqs, (std::vector<int64_t>{2, 0, 1}));
  EXPECT_EQ(p.num_prefill_tokens(), 5);
  EXPECT_EQ(p.num_tokens(), 7);
  // Decode rows: request 0 feeds its sampled token at position 6, request 1 at position 3.
  EXPECT_EQ(p.ids[5], 100);
  EXPECT_EQ(p.positions[5], 6);
  EXPECT_EQ(p.ids[6], 101);
  EXPECT_EQ(p.positions[6], 3);
  EXPECT_EQ(p.context_lens, (std::vector<int32_t>{7, 4}));
  EXPECT_EQ(p.query_starts, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(p.max_context_len, 7);
  EXPECT_EQ(p.sampling[1].draw, 1u);  // request 0 has drawn one token
  EXPECT_EQ(p.sampling[0].draw, 0u);
  s.commit(p, {7, 8, 9});
  p = s.plan();
  ASSERT_EQ(p.seqs, (std::vector<int64_t>{0, 1, 2}));  // running, in admission order
  const std::vector<int64_t> done = s.commit(p, {1, 2, 3});
  // Requests 0 and 1 reach max_new_tokens = 3 now; 2 has two tokens.
  EXPECT_EQ(done, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(s.output(0), (std::vector<int32_t>{100, 8, 1}));
  EXPECT_EQ(s.finish_reason(0), FinishReason::Length);
  EXPECT_EQ(s.running(), 1);
  EXPECT_EQ(s.free_blocks(), 16 - 2);  // request 2: 6 tokens cached + the next in its second block
}

TEST(GenerationScheduler, FirstPrefillOfAStepIgnoresTheBudgetAndSequenceLimitHolds) {
  GenerationScheduler s({4, 64, 8, 2, 128});
  s.submit(request(20, 2));
  s.submit(request(2, 2));
  s.submit(request(2, 2));
  StepPlan p = s.plan();
  EXPECT_EQ(p.seqs, (std::vector<int64_t>{0}));  // 20 > 8 but alone; the next would exceed the budget
  s.commit(p, {1});
  p = s.plan();
  EXPECT_EQ(p.seqs, (std::vector<int64_t>{1, 0}));  // max_seqs 2: request 2 waits
  s.commit(p, {1, 1});
  EXPECT_EQ(s.waiting(), 1);
}

// The preemption tests' job: a cache of 4 blocks of 2 tokens with `host_blocks` of swap space, and
// two prompts of 3 tokens, request 0 for 4 new tokens and request 1 for 8.
GenerationScheduler two_requests_in_a_small_cache(int64_t host_blocks) {
  GenerationLimits lim{2, 4, 64, 8, 64};
  lim.host_blocks = host_blocks;
  GenerationScheduler s(lim);
  s.submit(request(3, 4));
  s.submit(request(3, 8, 50));
  return s;
}

// The end of the two preemption tests below: request 1, alone in the cache of 4 blocks of 2 tokens,
// outgrows it (8 positions) before its 8 new tokens, and ends "length" with nothing more moved.
void expect_request_1_outgrows_the_cache(GenerationScheduler& s) {
  std::vector<int64_t> done;
  while (done.empty()) {
    StepPlan p = s.plan();
    EXPECT_TRUE(p.swap_out.empty() && p.swap_in.empty());
    done = s.commit(p, std::vector<int32_t>(p.seqs.size(), 23));
  }
  EXPECT_EQ(done, (std::vector<int64_t>{1}));
  EXPECT_EQ(s.finish_reason(1), FinishReason::Length);
  EXPECT_EQ(s.output(1).size(), 6u);  // positions 0..7 hold 3 + 5 tokens, the 6th sampled is not fed back
  EXPECT_EQ(s.free_blocks(), 4);
  EXPECT_TRUE(s.idle());
}

TEST(GenerationScheduler, PreemptsTheNewestWhenBlocksRunOutAndRecomputesIt) {
  // 4 blocks of 2 tokens; two prompts of 3 tokens take 2 blocks each; the next decode of each needs
  // a third block (position 4 is in block 2), and there is none: request 1 is preempted.
  GenerationScheduler s = two_requests_in_a_small_cache(0);
  StepPlan p = s.plan();
  s.commit(p, {10, 20});
  p = s.plan();  // both decode position 3 (block 1): no new block yet
  EXPECT_EQ(p.seqs.size(), 2u);
  s.commit(p, {11, 21});
  p = s.plan();
  EXPECT_EQ(s.preemptions(), 1);
  ASSERT_EQ(p.seqs, (std::vector<int64_t>{0}));
  EXPECT_EQ(p.positions[0], 4);
  s.commit(p, {12});
  // Request 1 needs 3 blocks for its 5 tokens: it waits until request 0 ends.
  p = s.plan();
  ASSERT_EQ(p.seqs, (std::vector<int64_t>{0}));
  EXPECT_EQ(s.commit(p, {13}), (std::vector<int64_t>{0}));
  p = s.plan();
  // Back with its prompt and the two tokens it made, prefilled again; its draw count continues.
  ASSERT_EQ(p.seqs, (std::vector<int64_t>{1}));
  EXPECT_EQ(p.ids, (std::vector<int32_t>{50, 51, 52, 20, 21}));
  EXPECT_EQ(p.sampling[0].draw, 2u);
  s.commit(p, {22});
  expect_request_1_outgrows_the_cache(s);
}

// The same job with swap space: request 1's two blocks go to the host when it is preempted, and
// come back into free blocks when request 0 ends; it then decodes on from position 4 with no prefill.
TEST(GenerationScheduler, SwapsPreemptedBlocksToTheHostAndResumesThem) {
  GenerationScheduler s = two_requests_in_a_small_cache(3);
  StepPlan p = s.plan();  // request 0 takes blocks 0 and 1, request 1 blocks 2 and 3
  EXPECT_TRUE(p.swap_out.empty());
  s.commit(p, {10, 20});
  p = s.plan();
  s.commit(p, {11, 21});
  p = s.plan();
  EXPECT_EQ(s.preemptions(), 1);
  EXPECT_EQ(s.swaps(), 1);
  ASSERT_EQ(p.seqs, (std::vector<int64_t>{0}));
  // Host blocks are a stack like the device's: 0 then 1.
  ASSERT_EQ(p.swap_out.size(), 2u);
  EXPECT_EQ(p.swap_out[0].device, 2);
  EXPECT_EQ(p.swap_out[0].host, 0);
  EXPECT_EQ(p.swap_out[1].device, 3);
  EXPECT_EQ(p.swap_out[1].host, 1);
  EXPECT_TRUE(p.swap_in.empty());
  EXPECT_EQ(p.slots[0], 2 * 2 + 0);  // request 0's position 4 goes to the first block request 1 freed
  EXPECT_EQ(s.free_host_blocks(), 1);
  s.commit(p, {12});
  p = s.plan();  // request 1 needs its 2 blocks and a third for position 4: one is free
  ASSERT_EQ(p.seqs, (std::vector<int64_t>{0}));
  EXPECT_TRUE(p.swap_in.empty());
  EXPECT_EQ(s.commit(p, {13}), (std::vector<int64_t>{0}));
  p = s.plan();
  // Back as a decode row: its last token (21) at position 4, its blocks copied into free ones.
  ASSERT_EQ(p.seqs, (std::vector<int64_t>{1}));
  EXPECT_EQ(p.num_prefill_seqs, 0);
  EXPECT_EQ(p.ids, (std::vector<int32_t>{21}));
  EXPECT_EQ(p.positions, (std::vector<int32_t>{4}));
  EXPECT_EQ(p.context_lens, (std::vector<int32_t>{5}));
  EXPECT_EQ(p.sampling[0].draw, 2u);
  ASSERT_EQ(p.swap_in.size(), 2u);
  EXPECT_EQ(p.swap_in[0].host, 0);
  EXPECT_EQ(p.swap_in[1].host, 1);
  // The block table is the swapped-in blocks, then the one for position 4.
  ASSERT_EQ(p.max_blocks, 3);
  EXPECT_EQ(p.block_tables[0], p.swap_in[0].device);
  EXPECT_EQ(p.block_tables[1], p.swap_in[1].device);
  EXPECT_EQ(p.slots[0], p.block_tables[2] * 2 + 0);
  EXPECT_EQ(s.free_host_blocks(), 3);
  s.commit(p, {22});
  expect_request_1_outgrows_the_cache(s);  // as when recomputed
}

// Without room for all of a sequence's blocks, it is recomputed as without swap space.
TEST(GenerationScheduler, RecomputesWhatTheSwapSpaceCannotHold) {
  GenerationScheduler s = two_requests_in_a_small_cache(1);
  for (int i = 0; i < 3; ++i) {
    StepPlan p = s.plan();
    EXPECT_TRUE(p.swap_out.empty());
    s.commit(p, std::vector<int32_t>(p.seqs.size(), 30 + i));
  }
  EXPECT_EQ(s.preemptions(), 1);
  EXPECT_EQ(s.swaps(), 0);
  EXPECT_EQ(s.free_host_blocks(), 1);
}

TEST(GenerationScheduler, StopTokensStopStringsAndTheContext) {
  io::BpeTokenizerParts parts;
  parts.source = "test";
  // A byte-level vocabulary: token i is byte i (the byte-level alphabet spells bytes 33..126 as themselves).
  for (int c = 33; c < 127; ++c) parts.vocab.push_back({std::string(1, char(c)), c});
  io::BpeTokenizer tok(std::move(parts));
  GenerationScheduler s({4, 32, 64, 8, 12}, &tok);
  GenerationRequest a = request(2, 100, 'a');
  a.stop_tokens = {'!'};
  GenerationRequest b = request(2, 100, 'a');
  b.stop_strings = {"XYZ"};
  GenerationRequest c = request(2, 100, 'a');  // stops at the context of 12 positions
  s.submit(a);
  s.submit(b);
  s.submit(c);
  const std::string feed = "pXYZ!qqqqqqqqqqqq";
  for (size_t i = 0; !s.idle(); ++i) {
    StepPlan p = s.plan();
    std::vector<int32_t> t(p.seqs.size(), int32_t(feed[i]));
    s.commit(p, t);
  }
  EXPECT_EQ(s.output(0).size(), 5u);  // p X Y Z !
  EXPECT_EQ(s.finish_reason(0), FinishReason::Stop);
  EXPECT_EQ(s.output(1).size(), 4u);  // the stop string ends with the fourth token
  EXPECT_EQ(s.finish_reason(1), FinishReason::Stop);
  EXPECT_EQ(s.output(2).size(), 11u);  // 2 + 11 = 13 > 12 positions: the 11th token cannot be fed back
  EXPECT_EQ(s.finish_reason(2), FinishReason::Length);
}

TEST(GenerationScheduler, RejectsRequestsThatCanNeverRun) {
  GenerationScheduler s({4, 2, 64, 8, 16});
  test::expect_error([&] { s.submit(request(0, 4)); }, {"request 0", "empty prompt"});
  test::expect_error([&] { s.submit(request(17, 4)); }, {"17 tokens", "16 positions"});
  test::expect_error([&] { s.submit(request(9, 4)); }, {"9 tokens", "2 blocks"});
  test::expect_error([&] { s.submit(request(2, 0)); }, {"max_new_tokens"});
  GenerationRequest r = request(2, 4);
  r.stop_strings = {"x"};
  test::expect_error([&] { s.submit(r); }, {"stop strings need a tokenizer"});
}

// ---- the KV-cache forward against full re-forwards ------------------------------------------------

struct GoldenLm {
  models::TransformerConfig cfg;
  std::unique_ptr<models::Transformer> model;
};

GoldenLm load_golden(const std::string& name, Device dev, DType dt) {
  const std::string dir = test::golden_path(name);
  GoldenLm g;
  g.cfg = models::TransformerConfig::from_hub_json(io::hub_config_of(dir), dir);
  g.model = std::make_unique<models::Transformer>(g.cfg, dev, dt);
  g.model->load(*io::WeightSource::open(dir, "model"));
  return g;
}

std::vector<double> host_doubles(const Tensor& t) {
  Tensor h = t.to(Device::cpu());
  std::vector<double> out(size_t(h.numel()));
  ZP_DISPATCH_FLOAT(h.dtype(), T, [&] {
    for (size_t i = 0; i < out.size(); ++i) out[i] = double(h.data<T>()[i]);
  });
  return out;
}

// Runs a plan through forward_cached; returns the logits [rows, padded vocab] on the host.
std::vector<double> run_cached(models::Transformer& m, nn::PagedKvCache& cache, const StepPlan& p) {
  const Device dev = m.ctx().dev;
  cache.swap(p.swap_out, p.swap_in, m.ctx().s);
  auto up = [&](const std::vector<int32_t>& v) {
    Tensor t = Tensor::empty({std::max<int64_t>(1, int64_t(v.size()))}, DType::I32, Device::cpu());
    std::copy(v.begin(), v.end(), t.data<int32_t>());
    return t.to(dev);
  };
  Tensor ids = up(p.ids), pos = up(p.positions), slots = up(p.slots), seg = up(p.segments), bt = up(p.block_tables),
         ctx = up(p.context_lens), qs = up(p.query_starts), rows = up(p.output_rows);
  nn::CachedBatch b;
  b.num_tokens = p.num_tokens();
  b.num_prefill_tokens = p.num_prefill_tokens();
  b.positions = pos.data<int32_t>();
  b.slots = slots.data<int32_t>();
  b.segments = seg.data<int32_t>();
  b.num_decode_seqs = int64_t(p.seqs.size()) - p.num_prefill_seqs;
  b.block_tables = bt.data<int32_t>();
  b.max_blocks = p.max_blocks;
  b.context_lens = ctx.data<int32_t>();
  b.query_starts = qs.data<int32_t>();
  b.max_context_len = p.max_context_len;
  b.output_rows = rows.data<int32_t>();
  b.num_outputs = int64_t(p.seqs.size());
  return host_doubles(m.forward_cached(ids.data<int32_t>(), b, cache));
}

// The last row's logits of a full forward over `tokens`.
std::vector<double> full_forward_last(models::Transformer& m, const std::vector<int32_t>& tokens) {
  Tensor ids = Tensor::empty({int64_t(tokens.size())}, DType::I32, Device::cpu());
  std::copy(tokens.begin(), tokens.end(), ids.data<int32_t>());
  Tensor d = ids.to(m.ctx().dev);
  models::TransformerActivations acts;
  m.forward(d.data<int32_t>(), 1, int64_t(tokens.size()), acts, models::ForwardMode::Inference);
  std::vector<double> all = host_doubles(acts.logits);
  const size_t ld = size_t(m.padded_vocab());
  return std::vector<double>(all.end() - ptrdiff_t(ld), all.end());
}

// Several ragged prompts, one joining while others decode, small blocks so that sequences cross
// them, and preemption: every logits row of the cached path equals a full re-forward of its
// sequence. Tokens follow the full forward's argmax, so both paths see the same sequences.
// With `host_blocks` of swap space, preempted sequences' keys and values go to the host and back
// instead of being prefilled again.
void expect_cached_matches_full(const std::string& name, Device dev, DType dt, double tol, int64_t host_blocks = 0) {
  GoldenLm g = load_golden(name, dev, dt);
  models::Transformer& m = *g.model;
  const int64_t bs = 4, blocks = 12;
  nn::PagedKvCache cache(g.cfg.layers, blocks, bs, g.cfg.kv_heads, g.cfg.head_dim, dt, dev, m.ctx().s, host_blocks);
  GenerationLimits lim{bs, blocks, 16, 8, g.cfg.max_positions};
  lim.host_blocks = host_blocks;
  GenerationScheduler s(lim);
  int64_t prompt_tokens = 0, prefilled = 0;
  std::vector<std::vector<int32_t>> prompts = {{5, 17, 3}, {200, 1, 2, 3, 4, 5, 6, 7, 8}, {42}};
  for (const auto& pr : prompts) {
    GenerationRequest r;
    r.prompt = pr;
    r.max_new_tokens = 9;
    s.submit(r);
    prompt_tokens += int64_t(pr.size());
  }
  const size_t V = size_t(g.cfg.vocab), ld = size_t(m.padded_vocab());
  double worst = 0;
  for (int step = 0; !s.idle(); ++step) {
    if (step == 3) {
      GenerationRequest r;
      r.prompt = {9, 9, 9, 9, 9, 9};
      r.max_new_tokens = 7;
      s.submit(r);
      prompt_tokens += int64_t(r.prompt.size());
    }
    StepPlan p = s.plan();
    prefilled += p.num_prefill_tokens();
    if (p.empty()) {
      s.commit(p, {});
      continue;
    }
    const std::vector<double> cached = run_cached(m, cache, p);
    std::vector<int32_t> next;
    for (size_t r = 0; r < p.seqs.size(); ++r) {
      std::vector<int32_t> seq = s.request(p.seqs[r]).prompt;
      const auto& out = s.output(p.seqs[r]);
      seq.insert(seq.end(), out.begin(), out.end());
      const std::vector<double> full = full_forward_last(m, seq);
      double scale = 0, err = 0;
      for (size_t c = 0; c < V; ++c) {
        scale = std::max(scale, std::abs(full[c]));
        err = std::max(err, std::abs(full[c] - cached[r * ld + c]));
      }
      worst = std::max(worst, err / scale);
      next.push_back(int32_t(std::max_element(full.begin(), full.begin() + ptrdiff_t(V)) - full.begin()));
    }
    s.commit(p, next);
  }
  const std::string what =
      name + " on " + dev.str() + " in " + std::string(dtype_name(dt)) + (host_blocks ? ", swapping" : "");
  EXPECT_LE(worst, tol) << what;
  EXPECT_GE(s.preemptions(), 1) << what << ": the test meant to exercise preemption";
  if (host_blocks > 0) {
    EXPECT_EQ(s.swaps(), s.preemptions()) << what << ": the swap space holds any sequence of this cache";
    EXPECT_EQ(prefilled, prompt_tokens) << what << ": a swapped sequence is never prefilled again";
  } else {
    EXPECT_GT(prefilled, prompt_tokens) << what << ": a recomputed sequence is prefilled again";
  }
}

TEST(KvCacheForward, MatchesFullForwardOnTheCpu) {
  for (const char* name : {"gpt2-tiny", "llama-tiny", "qwen2-tiny"}) {
    expect_cached_matches_full(name, Device::cpu(), DType::F64, 1e-12);
    expect_cached_matches_full(name, Device::cpu(), DType::F32, 1e-5);
    expect_cached_matches_full(name, Device::cpu(), DType::F32, 1e-5, /*host_blocks=*/12);
  }
}

TEST(KvCacheForwardGpu, MatchesFullForward) {
  ZP_SKIP_WITHOUT_GPU();
  for (const char* name : {"gpt2-tiny", "llama-tiny", "qwen2-tiny"}) {
    expect_cached_matches_full(name, Device::cuda(0), DType::F32, 1e-4);
    expect_cached_matches_full(name, Device::cuda(0), DType::BF16, 3e-2);
    expect_cached_matches_full(name, Device::cuda(0), DType::F32, 1e-4, /*host_blocks=*/12);
    expect_cached_matches_full(name, Device::cuda(0), DType::BF16, 3e-2, /*host_blocks=*/12);
  }
}

// The engine end to end on the CPU, where a row's numbers do not depend on the batch it ran in: a
// KV cache too small for the job (preempting) makes the same tokens as one that never preempts,
// whether its preempted sequences are recomputed or swapped to host memory and back.
TEST(GenerationEngine, SwappedAndRecomputedSequencesMakeTheUnpreemptedTokens) {
  GoldenLm g = load_golden("llama-tiny", Device::cpu(), DType::F32);
  auto outputs = [&](int64_t cache_blocks, int64_t swap_blocks, runtime::GenerationStats& stats) {
    runtime::GenerationOptions o;
    o.block_size = 4;
    const int64_t per_block = nn::PagedKvCache::bytes_for(g.cfg.layers, 1, o.block_size, g.cfg.kv_heads,
                                                          g.cfg.head_dim, DType::F32);
    o.kv_cache_bytes = cache_blocks * per_block;
    o.kv_swap_bytes = swap_blocks * per_block;
    runtime::GenerationEngine engine(*g.model, nullptr, o);
    EXPECT_EQ(engine.cache_blocks(), cache_blocks);
    EXPECT_EQ(engine.swap_blocks(), swap_blocks);
    for (int64_t n : {3, 11, 1, 9, 6}) {
      GenerationRequest r = request(n, 14, 7);
      if (n == 1 || n == 9) r.sampling = {0.9f, 0, 0.95f, 1.f, uint64_t(n), 0};
      engine.submit(r);
    }
    engine.run();
    stats = engine.stats();
    std::vector<std::vector<int32_t>> out;
    for (int64_t i = 0; i < 5; ++i) out.push_back(engine.output(i).ids);
    return out;
  };
  runtime::GenerationStats roomy, recomputed, swapped;
  const auto want = outputs(64, 0, roomy);
  EXPECT_EQ(roomy.preemptions, 0);
  EXPECT_EQ(outputs(9, 0, recomputed), want);
  EXPECT_GT(recomputed.preemptions, 0);
  EXPECT_EQ(recomputed.swaps, 0);
  EXPECT_EQ(outputs(9, 64, swapped), want);
  EXPECT_GT(swapped.swaps, 0);
  EXPECT_EQ(swapped.swaps, swapped.preemptions);
  EXPECT_EQ(swapped.swapped_in_blocks, swapped.swapped_out_blocks);
  EXPECT_EQ(swapped.prefill_tokens, roomy.prefill_tokens) << "swapped sequences are not prefilled again";
  EXPECT_GT(recomputed.prefill_tokens, roomy.prefill_tokens);
}

// ---- greedy generation against transformers -------------------------------------------------------

void expect_greedy_matches_transformers(const std::string& name, Device dev) {
  const nlohmann::json ref = nlohmann::json::parse(std::ifstream(test::golden_path(name + "/generate.json")));
  GoldenLm g = load_golden(name, dev, DType::F32);
  runtime::GenerationOptions o;
  o.block_size = 4;  // prompts and outputs cross blocks
  o.kv_cache_bytes = 1 << 22;
  o.max_batch_tokens = 24;  // the prompts join over several steps, while others decode
  runtime::GenerationEngine engine(*g.model, nullptr, o);
  const auto prompts = ref["prompts"].get<std::vector<std::vector<int32_t>>>();
  const auto want = ref["outputs"].get<std::vector<std::vector<int32_t>>>();
  for (const auto& p : prompts) {
    GenerationRequest r;
    r.prompt = p;
    r.max_new_tokens = ref["new_tokens"].get<int64_t>();
    engine.submit(r);
  }
  engine.run();
  double smallest_gap = 1e300;
  for (const auto& gaps : ref["logit_gaps"]) for (double x : gaps) smallest_gap = std::min(smallest_gap, x);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(engine.output(int64_t(i)).ids, want[i]) << name << " on " << dev.str() << ", prompt " << i
                                                      << " (smallest logit gap in the reference " << smallest_gap << ")";
  EXPECT_GT(engine.stats().steps, int64_t(ref["new_tokens"].get<int64_t>()));
}

TEST(GreedyGeneration, MatchesTransformersOnTheCpu) {
  for (const char* name : {"gpt2-tiny", "llama-tiny", "qwen2-tiny"}) expect_greedy_matches_transformers(name, Device::cpu());
}

TEST(GreedyGenerationGpu, MatchesTransformers) {
  ZP_SKIP_WITHOUT_GPU();
  for (const char* name : {"gpt2-tiny", "llama-tiny", "qwen2-tiny"})
    expect_greedy_matches_transformers(name, Device::cuda(0));
}

// ---- weight streaming ------------------------------------------------------------------------------

// Greedy outputs of a few ragged prompts, the model loaded with `offload` ("none" | "cpu").
std::vector<std::vector<int32_t>> greedy_outputs(const std::string& device, const std::string& dtype,
                                                 const std::string& offload, int64_t max_graph_seqs = 0,
                                                 runtime::GenerationStats* stats = nullptr, int64_t max_graphs = 0) {
  // From NVMe: a swap file under a fresh folder, read through two buffers so that blocks come from
  // the file on every forward, not only from the buffers.
  test::ScratchFolder swap("weight_streaming_nvme");
  runtime::InferenceModelOptions options{test::golden_path("llama-tiny"), "", device, dtype, offload};
  if (offload == "nvme") {
    options.nvme_path = swap.str();
    options.nvme_buffer_count = 2;
  }
  runtime::InferenceModel m(options);
  EXPECT_EQ(m.streams_weights(), offload != "none");
  runtime::GenerationOptions o;
  o.block_size = 8;
  o.kv_cache_bytes = 1 << 22;
  o.max_graph_seqs = max_graph_seqs;
  o.max_graphs = max_graphs;
  runtime::GenerationEngine engine(m.model(), nullptr, o);
  engine.set_before_forward(m.forward_hook());
  for (int64_t n : {3, 11, 1, 25}) {
    GenerationRequest r = request(n, n == 11 ? 40 : 20, 7);
    if (n == 1) r.sampling = {0.9f, 0, 0.95f, 1.f, 5, 0};  // sampled, within the graph too
    engine.submit(r);
  }
  engine.run();
  if (stats) *stats = engine.stats();
  if (max_graphs > 0) EXPECT_LE(engine.cached_graphs(), max_graphs);
  std::vector<std::vector<int32_t>> out;
  for (int64_t i = 0; i < 4; ++i) out.push_back(engine.output(i).ids);
  return out;
}

TEST(WeightStreaming, SameTokensAsResidentWeights) {
  const auto resident = greedy_outputs("cpu", "fp32", "none");
  EXPECT_EQ(greedy_outputs("cpu", "fp32", "cpu"), resident);
  EXPECT_EQ(greedy_outputs("cpu", "fp32", "nvme"), resident);
}

TEST(WeightStreamingGpu, SameTokensAsResidentWeights) {
  ZP_SKIP_WITHOUT_GPU();
  for (const char* dt : {"fp32", "bf16"}) {
    const auto resident = greedy_outputs("cuda", dt, "none");
    EXPECT_EQ(greedy_outputs("cuda", dt, "cpu"), resident) << dt;
    EXPECT_EQ(greedy_outputs("cuda", dt, "nvme"), resident) << dt << " from NVMe";
  }
}

// Decode steps replayed from CUDA graphs (rows padded to 4, 2, 1 as requests finish) make the same
// tokens as the same steps launched kernel by kernel.
TEST(DecodeGraphsGpu, SameTokensAsEagerSteps) {
  ZP_SKIP_WITHOUT_GPU();
  for (const char* dt : {"fp32", "bf16"}) {
    runtime::GenerationStats stats;
    EXPECT_EQ(greedy_outputs("cuda", dt, "none", 64, &stats), greedy_outputs("cuda", dt, "none", 0)) << dt;
    EXPECT_GT(stats.graph_steps, 20) << dt;
    EXPECT_EQ(stats.graphs_evicted, 0) << dt << ": the derived capacity holds this job's few shapes";
  }
}

// With room for one graph, every change of shape (rows 4, 2, 1; block tables widening as contexts
// grow) evicts the previous graph, and a shape that comes back is captured again: the tokens stay
// those of eager steps.
TEST(DecodeGraphsGpu, EvictedGraphsGiveTheSameTokens) {
  ZP_SKIP_WITHOUT_GPU();
  for (const char* dt : {"fp32", "bf16"}) {
    runtime::GenerationStats stats;
    EXPECT_EQ(greedy_outputs("cuda", dt, "none", 64, &stats, /*max_graphs=*/1), greedy_outputs("cuda", dt, "none", 0))
        << dt;
    EXPECT_GT(stats.graphs_evicted, 0) << dt;
    EXPECT_GT(stats.graph_steps, 0) << dt;
  }
}

TEST(InferenceModel, BadInputIsNamed) {
  test::expect_error([] { runtime::InferenceModel m({"/nonexistent/model", "", "cpu", "fp32", "none"}); },
                     {"/nonexistent/model", "no such file"});
  test::expect_error([] { runtime::InferenceModel m({test::golden_path("llama-tiny"), "", "tpu", "fp32", "none"}); },
                     {"--device", "tpu"});
  test::expect_error([] { runtime::InferenceModel m({test::golden_path("llama-tiny"), "", "cpu", "fp32", "disk"}); },
                     {"--offload-param", "disk"});
  test::expect_error([] { runtime::InferenceModel m({test::golden_path("llama-tiny"), "", "cpu", "fp32", "nvme"}); },
                     {"--offload-param nvme needs --nvme-path"});
  test::expect_error(
      [] {
        runtime::InferenceModel m({test::golden_path("llama-tiny"), "", "cpu", "fp32", "nvme", "/etc/hostname/swap"});
      },
      {"--nvme-path '/etc/hostname/swap'"});
  test::expect_error([] { runtime::InferenceModel m({test::golden_path("unet-sd-tiny"), "", "cpu", "fp32", "none"}); },
                     {"language models"});
}

}  // namespace
}  // namespace zp
