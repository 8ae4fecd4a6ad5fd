// lm-evaluation-harness semantics (issue 13, item 5): request building with real tokenizers (GPT-2's
// and Llama 3's), rolling windows worked out by hand, the metrics' formulas, task-file errors, and the
// acceptance test: the demo model on the license tasks against the reference that
// tests/reference/lm_eval_reference.py computes with transformers.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "io/bounded_json.h"
#include "io/tokenizer_files.h"
#include "runtime/eval_tasks.h"
#include "runtime/inference_model.h"
#include "runtime/lm_evaluation.h"
#include "runtime/loglikelihood_scorer.h"
#include "runtime/until_generator.h"
#include "test_runtime.h"
#include "test_util.h"

namespace zp::test {
namespace {
namespace fs = std::filesystem;
using namespace zp::runtime;
using io::BpeTokenizer;
using Ids = std::vector<int32_t>;

const fs::path kUnpacked = ZP_TOKENIZER_UNPACKED_DIR;
const fs::path kEvalData = ZP_EVAL_DATA_DIR;

const BpeTokenizer& gpt2() {
  static const BpeTokenizer t = io::load_tokenizer((kUnpacked / "gpt2").string());
  return t;
}
const BpeTokenizer& llama3() {
  static const BpeTokenizer t = io::load_tokenizer((kUnpacked / "llama3").string());
  return t;
}

Ids cat(Ids a, const Ids& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// ---- _encode_pair and loglikelihood's empty-context rule ----

TEST(LmEvaluation, TrailingWhitespaceMovesToTheContinuation) {
  const BpeTokenizer& t = gpt2();
  // "The cat " + "sat": the context is encoded as "The cat", the continuation is " sat" plus the
  // delimiter's space, i.e. what "The cat" + "  sat" encodes to after the context's tokens.
  const LoglikelihoodRequest r = encode_loglikelihood(t, "The cat ", " sat");
  EXPECT_EQ(r.context, t.encode("The cat"));
  const Ids whole = t.encode("The cat  sat");
  EXPECT_EQ(cat(r.context, r.continuation), whole);
  // Without the move, the context would end in a lone space token and " sat" would not be one token.
  const LoglikelihoodRequest plain = encode_loglikelihood(t, "The cat", " sat");
  EXPECT_EQ(plain.context, t.encode("The cat"));
  EXPECT_EQ(plain.continuation, t.encode(" sat"));
  EXPECT_EQ(plain.continuation.size(), 1u);
  // Newlines and tabs are whitespace too (Python's str.rstrip).
  const LoglikelihoodRequest nl = encode_loglikelihood(t, "Answer:\n\t", " yes");
  EXPECT_EQ(nl.context, t.encode("Answer:"));
  EXPECT_EQ(cat(nl.context, nl.continuation), t.encode("Answer:\n\t yes"));
}

TEST(LmEvaluation, ContinuationIsWhatFollowsTheEncodedContext) {
  const BpeTokenizer& t = gpt2();
  // "hello" + "world" merges across the boundary in GPT-2 ("helloworld" is not "hello" + "world"):
  // the continuation is the whole's tokens after as many as the context has.
  const Ids ctx = t.encode("hello"), whole = t.encode("helloworld");
  const LoglikelihoodRequest r = encode_loglikelihood(t, "hello", "world");
  EXPECT_EQ(r.context, ctx);
  EXPECT_EQ(r.continuation, Ids(whole.begin() + std::ptrdiff_t(ctx.size()), whole.end()));
}

TEST(LmEvaluation, EmptyContextStartsFromBosElseEos) {
  // GPT-2 has no BOS: the prefix is EOS (<|endoftext|>, 50256).
  const LoglikelihoodRequest g = encode_loglikelihood(gpt2(), "", " the end");
  EXPECT_EQ(g.context, Ids{50256});
  EXPECT_EQ(g.continuation, gpt2().encode(" the end"));
  // Llama 3 has one: <|begin_of_text|> (128000); the continuation is encoded without it.
  const LoglikelihoodRequest l = encode_loglikelihood(llama3(), "", " the end");
  EXPECT_EQ(l.context, Ids{128000});
  EXPECT_EQ(l.continuation, llama3().encode(" the end", {.add_special = false}));
  // A continuation that already starts with the prefix token keeps it as the context.
  const LoglikelihoodRequest p = encode_loglikelihood(llama3(), "", "<|begin_of_text|>Hi");
  EXPECT_EQ(p.context, Ids{128000});
  EXPECT_EQ(p.continuation, llama3().encode("Hi", {.add_special = false}));
}

TEST(LmEvaluation, BosFollowsTheTokenizersDefault) {
  // Llama 3 adds BOS by default (add_special_tokens=True): the context starts with it, the
  // continuation does not get a second one.
  const LoglikelihoodRequest l = encode_loglikelihood(llama3(), "Hello", " world");
  ASSERT_FALSE(l.context.empty());
  EXPECT_EQ(l.context.front(), 128000);
  EXPECT_EQ(l.continuation, llama3().encode(" world", {.add_special = false}));
  // A text that starts with the BOS text is not given another.
  EXPECT_EQ(harness_encode(llama3(), "<|begin_of_text|>Hi"), llama3().encode("<|begin_of_text|>Hi", {.add_special = false}));
  // GPT-2 adds nothing.
  EXPECT_EQ(encode_loglikelihood(gpt2(), "Hello", " world").context, gpt2().encode("Hello"));
}

TEST(LmEvaluation, BadPairsAreErrors) {
  expect_error([] { encode_loglikelihood(gpt2(), "   ", "x", "f.jsonl:3"); }, {"f.jsonl:3", "whitespace"});
  expect_error([] { encode_loglikelihood(gpt2(), "abc", "", "f.jsonl:4"); }, {"f.jsonl:4", "no token"});
}

// ---- the model's input and rolling windows ----

TEST(LmEvaluation, LongInputsKeepTheirLastMaxLengthPlusOneTokensMinusTheFinal) {
  LoglikelihoodRequest r{{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {11, 12, 13}};
  EXPECT_EQ(model_input(r, 8), (Ids{5, 6, 7, 8, 9, 10, 11, 12}));      // last 9 = 5..13, without 13
  EXPECT_EQ(model_input(r, 100), (Ids{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));  // short: all but the final
  EXPECT_EQ(model_input(r, 3), (Ids{10, 11, 12}));  // last 4 = 10..13
}

TEST(LmEvaluation, RollingWindowsByHand) {
  // tokens 1..10, prefix 0, max_length 4 (get_rolling_token_windows, context_len 1, then
  // make_disjoint_window):
  //   first:  input [0 1 2 3]  predicts 1 2 3 4   -> context [0],      continuation [1 2 3 4]
  //   second: input [4 5 6 7]  predicts 5 6 7 8   -> context [4],      continuation [5 6 7 8]
  //   last:   input [6 7 8 9]  predicts 9 10      -> context [6 7 8],  continuation [9 10]
  const Ids tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const auto w = rolling_windows(tokens, 0, 4);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0].context, Ids{0});
  EXPECT_EQ(w[0].continuation, (Ids{1, 2, 3, 4}));
  EXPECT_EQ(w[1].context, Ids{4});
  EXPECT_EQ(w[1].continuation, (Ids{5, 6, 7, 8}));
  EXPECT_EQ(w[2].context, (Ids{6, 7, 8}));
  EXPECT_EQ(w[2].continuation, (Ids{9, 10}));
  for (const auto& r : w) EXPECT_LE(model_input(r, 4).size(), 4u);
  EXPECT_EQ(model_input(w[2], 4), (Ids{6, 7, 8, 9}));
  // An exact multiple: two full windows. Shorter than max_length: one.
  const auto w8 = rolling_windows({1, 2, 3, 4, 5, 6, 7, 8}, 0, 4);
  ASSERT_EQ(w8.size(), 2u);
  EXPECT_EQ(w8[1].context, Ids{4});
  EXPECT_EQ(w8[1].continuation, (Ids{5, 6, 7, 8}));
  const auto w2 = rolling_windows({7, 8}, 0, 4);
  ASSERT_EQ(w2.size(), 1u);
  EXPECT_EQ(w2[0].context, Ids{0});
  EXPECT_EQ(w2[0].continuation, (Ids{7, 8}));
  EXPECT_TRUE(rolling_windows({}, 0, 4).empty());
  // Every token is predicted exactly once.
  const auto w5 = rolling_windows(tokens, 0, 3);
  Ids predicted;
  for (const auto& r : w5) predicted = cat(predicted, r.continuation);
  EXPECT_EQ(predicted, tokens);
}

// ---- metrics ----

TEST(LmEvaluation, AccNormDividesByCharactersOfTheChoice) {
  // acc: the largest sum (choice 0); acc_norm: the largest sum per character (choice 1: -12/6 > -10/2).
  EXPECT_EQ(score_choices({-10, -12}, {"ab", "abcdef"}, 0).acc, 1.0);
  EXPECT_EQ(score_choices({-10, -12}, {"ab", "abcdef"}, 0).acc_norm, 0.0);
  EXPECT_EQ(score_choices({-10, -12}, {"ab", "abcdef"}, 1).acc_norm, 1.0);
  // Characters, not bytes: "éé" is 2 characters (4 bytes). Per character -4/2 = -2 < -5/3; per byte
  // it would be -1 > -5/3.
  EXPECT_EQ(score_choices({-4, -5}, {"\xc3\xa9\xc3\xa9", "abc"}, 1).acc_norm, 1.0);
  // Ties go to the first, as np.argmax.
  EXPECT_EQ(score_choices({-3, -3}, {"a", "b"}, 0).acc, 1.0);
  EXPECT_EQ(utf8_characters("a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"), 4);
}

TEST(LmEvaluation, StderrIsSampleStddevOverSqrtN) {
  // mean 0.75; sample variance (3 * 0.0625 + 0.5625) / 3 = 0.25; stderr 0.5 / 2.
  EXPECT_DOUBLE_EQ(mean_stderr({1, 0, 1, 1}), 0.25);
  EXPECT_TRUE(std::isnan(mean_stderr({1})));
}

TEST(LmEvaluation, WordsAndWhitespaceAsPython) {
  // len(re.split(r"\s+", s)): empty pieces at the ends count.
  EXPECT_EQ(count_words("a b  c\n"), 4);
  EXPECT_EQ(count_words(" a"), 2);
  EXPECT_EQ(count_words(""), 1);
  EXPECT_EQ(count_words("one\ttwo\xc2\xa0three"), 3);  // a no-break space is \s in Python 3
  EXPECT_EQ(rstrip_whitespace("abc \n\t"), "abc");
  EXPECT_EQ(rstrip_whitespace("x\xe3\x80\x80"), "x");  // U+3000
  EXPECT_EQ(rstrip_whitespace("   "), "");
}

// ---- task files ----

std::string write_task(const std::string& name, const std::string& body) {
  const fs::path dir = fs::temp_directory_path() / ("zp-eval-tasks-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string p = (dir / name).string();
  std::ofstream(p) << body;
  return p;
}

TEST(LmEvaluation, TaskFileErrorsNameFileLineAndField) {
  const std::string mc = R"({"task": "t", "output_type": "multiple_choice"})";
  const std::string p1 = write_task("type.jsonl", R"({"task": "t", "output_type": "multiple_choise"})" "\n");
  expect_error([&] { read_eval_task(p1); }, {p1 + ":1", "output_type", "multiple_choise"});
  const std::string p2 = write_task("gold.jsonl", mc + "\n" + R"({"context": "a", "choices": ["b"], "gold": 0})" + "\n\n" +
                                                      R"({"context": "a", "choices": ["b", "c"], "gold": 2})" "\n");
  expect_error([&] { read_eval_task(p2); }, {p2 + ":4", "'gold'", "outside"});
  const std::string p3 = write_task("key.jsonl", mc + "\n" + R"({"context": "a", "choices": ["b"], "answer": 0})" "\n");
  expect_error([&] { read_eval_task(p3); }, {p3 + ":2", "unknown field 'answer'"});
  const std::string p4 = write_task("json.jsonl", mc + "\n{\"context\": \n");
  expect_error([&] { read_eval_task(p4); }, {p4 + ":2", "JSON"});
  const std::string p5 = write_task("type2.jsonl", mc + "\n" + R"({"context": 3, "choices": ["b"], "gold": 0})" "\n");
  expect_error([&] { read_eval_task(p5); }, {p5 + ":2", "'context'", "string"});
  const std::string p6 = write_task("empty.jsonl", mc + "\n");
  expect_error([&] { read_eval_task(p6); }, {p6, "no document"});
  const std::string p7 = write_task("until.jsonl", R"({"task": "t", "output_type": "loglikelihood_rolling", "until": ["x"]})" "\n");
  expect_error([&] { read_eval_task(p7); }, {p7 + ":1", "'until'", "generate_until"});
  const std::string p8 = write_task("missing.jsonl", R"({"task": "t", "output_type": "loglikelihood_rolling"})" "\n{}\n");
  expect_error([&] { read_eval_task(p8); }, {p8 + ":2", "missing field 'text'"});
  // Defaults: one space; generate_until stops at the few-shot delimiter.
  const EvalTask g = read_eval_task(write_task("gen.jsonl", R"({"task": "g", "output_type": "generate_until"})" "\n" +
                                                              std::string(R"({"context": "q", "target": "a"})") + "\n"));
  EXPECT_EQ(g.target_delimiter, " ");
  EXPECT_EQ(g.until, std::vector<std::string>{"\n\n"});
  EXPECT_EQ(g.max_gen_toks, 256);
}

// ---- the evaluation with stand-in scorers: the results' shape and the metrics' plumbing ----

TEST(LmEvaluation, ResultsShapedLikeTheHarness) {
  RuntimeLease lease;
  EvalTask mc;
  mc.name = "toy_mc";
  mc.path = "toy.jsonl";
  mc.docs = {{2, "The sky is", {"blue", "green"}, 0, "", ""}, {3, "Grass is", {"red", "green"}, 1, "", ""},
             {4, "", {"yes", "no"}, 1, "", ""}};
  EvalTask roll;
  roll.name = "toy_rolling";
  roll.path = "roll.jsonl";
  roll.output_type = EvalOutputType::LoglikelihoodRolling;
  roll.docs = {{2, "", {}, 0, "one two three", ""}};
  EvalTask gen;
  gen.name = "toy_gen";
  gen.path = "gen.jsonl";
  gen.output_type = EvalOutputType::GenerateUntil;
  gen.until = {"\n"};
  gen.max_gen_toks = 4;
  gen.docs = {{2, "Q: 1+1=", {}, 0, "", "2"}, {3, "Q: 2+2=", {}, 0, "", "4"}};
  // Stand-ins: a continuation's log-probability is minus its token count; generation answers "2\nmore".
  int64_t scored = 0;
  const ScoreLoglikelihood score = [&](const std::vector<LoglikelihoodRequest>& reqs) {
    std::vector<LoglikelihoodResult> out;
    for (const auto& r : reqs) out.push_back({-double(r.continuation.size()), false});
    scored += int64_t(reqs.size());
    return out;
  };
  const GreedyGenerate generate = [](const std::vector<GenerationAsk>& asks) {
    return std::vector<std::string>(asks.size(), "2\nmore");
  };
  LmEvaluationOptions opt;
  opt.max_length = 8;
  opt.config["model"] = "stand-in";
  const nlohmann::ordered_json r = evaluate_tasks({mc, roll, gen}, gpt2(), opt, score, generate, MPI_COMM_SELF);
  // " blue" and " green" are one token each: ties go to the first choice.
  EXPECT_DOUBLE_EQ(r["results"]["toy_mc"]["acc,none"].get<double>(), 1.0 / 3.0);
  EXPECT_EQ(r["results"]["toy_mc"]["alias"], "toy_mc");
  EXPECT_TRUE(r["results"]["toy_mc"].contains("acc_norm_stderr,none"));
  const auto& rr = r["results"]["toy_rolling"];
  const double ll = -double(gpt2().encode("one two three").size());
  EXPECT_DOUBLE_EQ(rr["word_perplexity,none"].get<double>(), std::exp(-ll / 3));
  EXPECT_DOUBLE_EQ(rr["byte_perplexity,none"].get<double>(), std::exp(-ll / 13));
  EXPECT_DOUBLE_EQ(rr["bits_per_byte,none"].get<double>(), -ll / 13 / std::log(2.0));
  EXPECT_EQ(rr["word_perplexity_stderr,none"], "N/A");
  EXPECT_DOUBLE_EQ(r["results"]["toy_gen"]["exact_match,none"].get<double>(), 0.5);  // "2\nmore" cut at "\n"
  EXPECT_EQ(r["n-samples"]["toy_mc"]["original"], 3);
  EXPECT_EQ(r["higher_is_better"]["toy_rolling"]["bits_per_byte"], false);
  EXPECT_EQ(r["config"]["model"], "stand-in");
  for (const char* k : {"results", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better", "n-samples", "config"})
    EXPECT_TRUE(r.contains(k)) << k;
  EXPECT_EQ(scored, 6 + 1);
  const std::string table = results_table(r);
  EXPECT_NE(table.find("|toy_mc"), std::string::npos) << table;
  EXPECT_NE(table.find("acc_norm"), std::string::npos) << table;
  // --limit takes the first documents.
  opt.limit = 1;
  const auto limited = evaluate_tasks({mc}, gpt2(), opt, score, generate, MPI_COMM_SELF);
  EXPECT_EQ(limited["n-samples"]["toy_mc"]["effective"], 1);
  EXPECT_EQ(limited["n-samples"]["toy_mc"]["original"], 3);
}

// ---- the demo model ----

TEST(LmEvaluation, DemoTokenizerGivesByteValues) {
  const BpeTokenizer t = io::load_tokenizer((kEvalData / "demo-model").string());
  const std::string s = "Copyright (C) 2007  <x>\n\tend\f";
  Ids bytes;
  for (unsigned char c : s) bytes.push_back(int32_t(c));
  EXPECT_EQ(t.encode(s), bytes);
  EXPECT_EQ(t.encode(s, {.add_special = true}), bytes);
  EXPECT_EQ(t.decode(bytes), s);
  EXPECT_FALSE(t.bos_id().has_value());
  EXPECT_EQ(t.eos_id(), 0);
  EXPECT_EQ(t.vocab_size(), 256);
}

TEST(LmEvaluation, BatchingDoesNotChangeScores) {
  // The same requests scored one per forward and many per forward: right padding with the causal mask
  // leaves each request's positions as they were, so the scores agree to rounding.
  InferenceModel m({(kEvalData / "demo-model").string(), "", "cpu", "fp32"});
  const EvalTask t = read_eval_task((kEvalData / "licenses_mc.jsonl").string());
  std::vector<LoglikelihoodRequest> reqs;
  for (size_t d = 0; d < 20; ++d)
    for (const auto& c : t.docs[d].choices) reqs.push_back(encode_loglikelihood(*m.tokenizer(), t.docs[d].context, " " + c));
  LoglikelihoodScorer one(m.model(), m.stream(), 128, 1), many(m.model(), m.stream(), 128, 8192);
  const auto a = one.score(reqs), b = many.score(reqs);
  EXPECT_EQ(one.forwards(), int64_t(reqs.size()));
  EXPECT_LT(many.forwards(), 10);
  double worst = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    worst = std::max(worst, std::abs(a[i].logprob - b[i].logprob) / std::abs(a[i].logprob));
    EXPECT_EQ(a[i].is_greedy, b[i].is_greedy) << i;
  }
  EXPECT_LT(worst, 1e-6);
  std::printf("batched vs one at a time: largest relative difference %.3g\n", worst);
}

TEST(LmEvaluation, UntilGenerationIsGreedyAndStopsAtUntil) {
  // What greedy generation makes, the scorer must call greedy (every token the argmax).
  InferenceModel m({(kEvalData / "demo-model").string(), "", "cpu", "fp32"});
  const BpeTokenizer& t = *m.tokenizer();
  const Ids ctx = t.encode("This License applies to any");
  const auto made = generate_greedy_until(m.model(), t, 128, {{ctx, {}, 12}});
  ASSERT_EQ(made.size(), 1u);
  ASSERT_EQ(made[0].size(), 12u);  // one byte per token, no EOS in the licenses
  LoglikelihoodScorer scorer(m.model(), m.stream(), 128, 8192);
  const auto r = scorer.score(std::vector<LoglikelihoodRequest>{LoglikelihoodRequest{ctx, t.encode(made[0])}});
  EXPECT_TRUE(r[0].is_greedy) << made[0];
  // A stop string ends generation once it appears (the evaluation then cuts the text there).
  const std::string stop = made[0].substr(3, 2);
  const auto stopped = generate_greedy_until(m.model(), t, 128, {{ctx, {stop}, 12}});
  EXPECT_EQ(stopped[0], made[0].substr(0, made[0].find(stop) + stop.size()));
  // The context plus what is made never passes max_length.
  const auto capped = generate_greedy_until(m.model(), t, int64_t(ctx.size()) + 4, {{ctx, {}, 12}});
  EXPECT_EQ(capped[0].size(), 4u);
}

// The acceptance test of issue 13's evaluation: the demo model (trained here, exported to the hub
// layout) scored by `zeropipe eval`'s library on the license tasks equals the reference that
// tests/reference/lm_eval_reference.py computes with transformers and the harness's rules, "within
// ±0.1 points": acc and acc_norm are fractions, so ±0.1 percentage points is ±0.001; perplexities
// (word, byte) and bits_per_byte are not percentages, so ±0.1 points is read as ±0.1% of the value,
// a relative 1e-3. Fails until tests/data/eval/reference_results.json has been made on a host with
// torch and transformers:
//   python3 tests/reference/lm_eval_reference.py --model tests/data/eval/demo-model \
//     --tasks tests/data/eval/licenses_mc.jsonl tests/data/eval/licenses_rolling.jsonl \
//     --out tests/data/eval/reference_results.json
void expect_demo_model_matches_reference(const std::string& device) {
  RuntimeLease lease;
  InferenceModel m({(kEvalData / "demo-model").string(), "", device, "fp32"});
  const std::vector<EvalTask> tasks = {read_eval_task((kEvalData / "licenses_mc.jsonl").string()),
                                       read_eval_task((kEvalData / "licenses_rolling.jsonl").string())};
  LoglikelihoodScorer scorer(m.model(), m.stream(), m.config().max_positions, 8192);
  LmEvaluationOptions opt;
  opt.max_length = m.config().max_positions;
  const auto ours = evaluate_tasks(tasks, *m.tokenizer(), opt, [&](const auto& r) { return scorer.score(r); }, {},
                                   MPI_COMM_SELF);
  std::printf("%s", results_table(ours).c_str());
  const fs::path ref_path = kEvalData / "reference_results.json";
  ASSERT_TRUE(fs::exists(ref_path)) << ref_path << " is missing: make it on a host with torch and transformers:\n"
                                    << "  python3 tests/reference/lm_eval_reference.py --model tests/data/eval/demo-model "
                                       "--tasks tests/data/eval/licenses_mc.jsonl tests/data/eval/licenses_rolling.jsonl "
                                       "--out tests/data/eval/reference_results.json";
  std::ifstream in(ref_path);
  const nlohmann::json ref = io::parse_json_bounded(in, ref_path.string());
  for (const char* task : {"licenses_mc", "licenses_rolling"}) {
    ASSERT_TRUE(ref["results"].contains(task)) << task;
    EXPECT_EQ(ours["n-samples"][task]["effective"].get<int64_t>(), ref["n-samples"][task]["effective"].get<int64_t>());
  }
  for (const char* k : {"acc,none", "acc_norm,none"}) {
    const double a = ours["results"]["licenses_mc"][k].get<double>(), b = ref["results"]["licenses_mc"][k].get<double>();
    EXPECT_NEAR(a, b, 0.001) << k << ": ours " << a << ", reference " << b;
  }
  for (const char* k : {"word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"}) {
    const double a = ours["results"]["licenses_rolling"][k].get<double>(),
                 b = ref["results"]["licenses_rolling"][k].get<double>();
    EXPECT_NEAR(a, b, 1e-3 * std::abs(b)) << k << ": ours " << a << ", reference " << b;
  }
}

TEST(LmEvaluation, DemoModelMatchesTheHarnessReference) { expect_demo_model_matches_reference("cpu"); }

TEST(LmEvaluationGpu, DemoModelMatchesTheHarnessReference) {
  ZP_SKIP_WITHOUT_GPU();
  expect_demo_model_matches_reference("cuda");
}

}  // namespace
}  // namespace zp::test
