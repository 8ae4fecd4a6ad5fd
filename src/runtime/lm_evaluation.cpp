#include "runtime/lm_evaluation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "comm/text_gather.h"
#include "core/error.h"

namespace zp::runtime {

using ojson = nlohmann::ordered_json;

// ---- text measures ----

namespace {

// One UTF-8 code point at text[i]: its value and length. An invalid or truncated sequence is one
// byte of value 0xFFFD (Python would have refused to decode it; one byte keeps counting going).
std::pair<uint32_t, size_t> code_point(std::string_view s, size_t i) {
  const auto b = uint8_t(s[i]);
  size_t n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return {0xFFFD, 1};
  uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
  for (size_t k = 1; k < n; ++k) {
    const auto c = uint8_t(s[i + k]);
    if ((c >> 6) != 0x2) return {0xFFFD, 1};
    cp = (cp << 6) | (c & 0x3F);
  }
  return {cp, n};
}

// Python's str.isspace (and what re's \s matches in a str pattern).
bool is_python_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

}  // namespace

std::string_view rstrip_whitespace(std::string_view text) {
  size_t end = 0;  // one past the last non-space code point
  for (size_t i = 0; i < text.size();) {
    const auto [cp, n] = code_point(text, i);
    i += n;
    if (!is_python_space(cp)) end = i;
  }
  return text.substr(0, end);
}

int64_t utf8_characters(std::string_view text) {
  int64_t n = 0;
  for (size_t i = 0; i < text.size(); ++n) i += code_point(text, i).second;
  return n;
}

int64_t count_words(std::string_view text) {
  int64_t pieces = 1;
  bool in_space = false;
  for (size_t i = 0; i < text.size();) {
    const auto [cp, n] = code_point(text, i);
    i += n;
    const bool space = is_python_space(cp);
    if (space && !in_space) ++pieces;
    in_space = space;
  }
  return pieces;
}

double mean_stderr(const std::vector<double>& v) {
  if (v.size() < 2) return std::numeric_limits<double>::quiet_NaN();
  double mu = 0;
  for (double x : v) mu += x;
  mu /= double(v.size());
  double ss = 0;
  for (double x : v) ss += (x - mu) * (x - mu);
  return std::sqrt(ss / double(v.size() - 1)) / std::sqrt(double(v.size()));
}

ChoiceScores score_choices(const std::vector<double>& lls, const std::vector<std::string>& choices, int64_t gold) {
  ZP_CHECK(lls.size() == choices.size() && !lls.empty(), lls.size(), " log-likelihoods for ", choices.size(), " choices");
  size_t pred = 0, pred_norm = 0;
  double best_norm = lls[0] / double(utf8_characters(choices[0]));
  for (size_t i = 1; i < lls.size(); ++i) {
    if (lls[i] > lls[pred]) pred = i;  // strict: the first of equals wins, as np.argmax
    const double norm = lls[i] / double(utf8_characters(choices[i]));
    if (norm > best_norm) {
      best_norm = norm;
      pred_norm = i;
    }
  }
  return {pred == size_t(gold) ? 1.0 : 0.0, pred_norm == size_t(gold) ? 1.0 : 0.0};
}

// ---- request building ----

int32_t prefix_token(const io::BpeTokenizer& tok) {
  if (tok.bos_id()) return *tok.bos_id();
  ZP_REQUIRE(tok.eos_id().has_value(), tok.source(),
             ": has neither a BOS nor an EOS token; evaluation needs one to stand before an empty context and the "
             "first rolling window (lm-evaluation-harness's prefix_token_id)");
  return *tok.eos_id();
}

std::vector<int32_t> harness_encode(const io::BpeTokenizer& tok, std::string_view text) {
  const int32_t prefix = prefix_token(tok);
  const std::string prefix_text = tok.decode(std::span<const int32_t>(&prefix, 1));
  const bool starts_with_prefix = !prefix_text.empty() && text.substr(0, prefix_text.size()) == prefix_text;
  return tok.encode(text, {.add_special = !starts_with_prefix});
}

LoglikelihoodRequest encode_loglikelihood(const io::BpeTokenizer& tok, std::string_view context,
                                          std::string_view continuation, const std::string& where) {
  const std::string at = where.empty() ? "" : where + ": ";
  LoglikelihoodRequest r;
  if (context.empty()) {
    r.continuation = tok.encode(continuation, {.add_special = false});
    ZP_REQUIRE(!r.continuation.empty(), at, "the continuation encodes to no token");
    const int32_t prefix = prefix_token(tok);
    if (r.continuation.front() != prefix) {
      r.context = {prefix};
    } else {
      r.context = {prefix};
      r.continuation.erase(r.continuation.begin());
      ZP_REQUIRE(!r.continuation.empty(), at, "the continuation is only the prefix token");
    }
    return r;
  }
  // Trailing whitespace of the context belongs to the continuation: " word" is one token in most
  // vocabularies, and the context must not end in half of it.
  const std::string_view ctx = rstrip_whitespace(context);
  const std::string whole = std::string(context) + std::string(continuation);  // = ctx + moved spaces + continuation
  const std::vector<int32_t> whole_enc = harness_encode(tok, whole);
  r.context = harness_encode(tok, ctx);
  ZP_REQUIRE(!r.context.empty(), at,
             "the context is only whitespace, which leaves no context token once it moves to the continuation");
  ZP_REQUIRE(whole_enc.size() > r.context.size(), at, "the continuation adds no token to the context's encoding");
  r.continuation.assign(whole_enc.begin() + std::ptrdiff_t(r.context.size()), whole_enc.end());
  return r;
}

std::vector<LoglikelihoodRequest> rolling_windows(const std::vector<int32_t>& tokens, int32_t prefix,
                                                  int64_t max_length) {
  ZP_CHECK(max_length >= 1, "max_length ", max_length);
  std::vector<LoglikelihoodRequest> out;
  const int64_t n = int64_t(tokens.size());
  if (n == 0) return out;
  auto slice = [&](int64_t a, int64_t b) {
    return std::vector<int32_t>(tokens.begin() + std::ptrdiff_t(a), tokens.begin() + std::ptrdiff_t(b));
  };
  // The first window predicts its every token after the prefix token: disjoint, its context is the
  // prefix alone.
  const int64_t first = std::min(max_length, n);
  out.push_back({{prefix}, slice(0, first)});
  // Each later window predicts up to max_length tokens; its input is the max_length tokens before its
  // last one, so its context is what precedes the predicted tokens in that input: one token for a
  // full window, more for a shorter last one.
  for (int64_t predicted = first; predicted < n;) {
    const int64_t pred_len = std::min(n - predicted, max_length);
    const int64_t end = predicted + pred_len;
    const int64_t input_start = end - max_length - 1;  // >= 0: predicted >= max_length here
    out.push_back({slice(input_start, predicted), slice(predicted, end)});
    predicted = end;
  }
  return out;
}

std::vector<int32_t> model_input(const LoglikelihoodRequest& r, int64_t max_length) {
  std::vector<int32_t> all(r.context);
  all.insert(all.end(), r.continuation.begin(), r.continuation.end());
  const int64_t keep = std::min<int64_t>(int64_t(all.size()), max_length + 1);
  return std::vector<int32_t>(all.end() - std::ptrdiff_t(keep), all.end() - 1);
}

// ---- distribution over ranks ----

namespace {

// Items [0, count) are dealt to ranks by index (i % world); `work` computes this rank's (given their
// indices, in increasing order) and returns one serialized result each. Returns, on rank 0, every
// item's serialized result in index order (empty elsewhere).
std::vector<std::string> deal_and_gather(int64_t count, MPI_Comm comm,
                                         const std::function<std::vector<std::string>(const std::vector<int64_t>&)>& work) {
  int rank = 0, world = 1;
  ZP_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  ZP_MPI_CHECK(MPI_Comm_size(comm, &world));
  std::vector<int64_t> mine;
  for (int64_t i = rank; i < count; i += world) mine.push_back(i);
  const std::vector<std::string> done = work(mine);
  ZP_CHECK(done.size() == mine.size(), done.size(), " results for ", mine.size(), " items");
  // Flatten: [u64 length][bytes] per result.
  std::string packed;
  for (const auto& s : done) {
    const uint64_t len = s.size();
    packed.append(reinterpret_cast<const char*>(&len), sizeof(len));
    packed += s;
  }
  const std::vector<std::string> parts = comm::gather_text(packed, 0, comm);
  std::vector<std::string> out;
  if (rank != 0) return out;
  out.resize(size_t(count));
  for (int r = 0; r < world; ++r) {
    const std::string& all = parts[size_t(r)];
    size_t p = 0;
    for (int64_t i = r; i < count; i += world) {
      uint64_t len = 0;
      std::memcpy(&len, all.data() + p, sizeof(len));
      p += sizeof(len);
      out[size_t(i)] = all.substr(p, len);
      p += len;
    }
  }
  return out;
}

std::vector<LoglikelihoodResult> score_distributed(const std::vector<LoglikelihoodRequest>& reqs,
                                                   const ScoreLoglikelihood& score, MPI_Comm comm) {
  const std::vector<std::string> packed = deal_and_gather(int64_t(reqs.size()), comm, [&](const std::vector<int64_t>& idx) {
    std::vector<LoglikelihoodRequest> mine;
    mine.reserve(idx.size());
    for (int64_t i : idx) mine.push_back(reqs[size_t(i)]);
    const std::vector<LoglikelihoodResult> res = score(mine);
    ZP_CHECK(res.size() == mine.size(), "the scorer returned ", res.size(), " results for ", mine.size(), " requests");
    std::vector<std::string> out;
    for (const auto& r : res) {
      std::string s(sizeof(double) + 1, '\0');
      std::memcpy(s.data(), &r.logprob, sizeof(double));
      s[sizeof(double)] = r.is_greedy ? 1 : 0;
      out.push_back(std::move(s));
    }
    return out;
  });
  std::vector<LoglikelihoodResult> out(packed.size());
  for (size_t i = 0; i < packed.size(); ++i) {
    std::memcpy(&out[i].logprob, packed[i].data(), sizeof(double));
    out[i].is_greedy = packed[i][sizeof(double)] != 0;
  }
  return out;
}

std::vector<std::string> generate_distributed(const std::vector<GenerationAsk>& asks, const GreedyGenerate& generate,
                                              MPI_Comm comm) {
  return deal_and_gather(int64_t(asks.size()), comm, [&](const std::vector<int64_t>& idx) {
    std::vector<GenerationAsk> mine;
    for (int64_t i : idx) mine.push_back(asks[size_t(i)]);
    std::vector<std::string> res = generate(mine);
    ZP_CHECK(res.size() == mine.size(), "the generator returned ", res.size(), " texts for ", mine.size(), " asks");
    return res;
  });
}

// A metric's value for the JSON: a number, or "N/A" where the harness writes it (NaN, infinity).
ojson number_or_na(double v) { return std::isfinite(v) ? ojson(v) : ojson("N/A"); }

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? std::numeric_limits<double>::quiet_NaN() : s / double(v.size());
}

struct TaskOutcome {
  ojson metrics = ojson::object();           // "acc,none": ..., "acc_stderr,none": ...
  ojson higher_is_better = ojson::object();  // "acc": true, ...
};

void add_mean_metric(TaskOutcome& o, const std::string& name, const std::vector<double>& per_doc) {
  o.metrics[name + ",none"] = number_or_na(mean_of(per_doc));
  o.metrics[name + "_stderr,none"] = number_or_na(mean_stderr(per_doc));
  o.higher_is_better[name] = true;
}

TaskOutcome run_multiple_choice(const EvalTask& t, size_t n_docs, const io::BpeTokenizer& tok,
                                const LmEvaluationOptions& opt, const ScoreLoglikelihood& score, MPI_Comm comm) {
  std::vector<LoglikelihoodRequest> reqs;
  for (size_t d = 0; d < n_docs; ++d) {
    const EvalDocument& doc = t.docs[d];
    const std::string where = t.path + ":" + std::to_string(doc.line);
    for (const auto& choice : doc.choices) {
      reqs.push_back(encode_loglikelihood(tok, doc.context, t.target_delimiter + choice, where));
      ZP_REQUIRE(int64_t(reqs.back().continuation.size()) <= opt.max_length, where, ": a choice's continuation is ",
                 reqs.back().continuation.size(), " tokens, longer than the model's context of ", opt.max_length);
    }
  }
  const std::vector<LoglikelihoodResult> res = score_distributed(reqs, score, comm);
  TaskOutcome o;
  if (res.empty() && !reqs.empty()) return o;  // not rank 0
  std::vector<double> acc, acc_norm;
  size_t k = 0;
  for (size_t d = 0; d < n_docs; ++d) {
    const EvalDocument& doc = t.docs[d];
    std::vector<double> lls;
    for (size_t c = 0; c < doc.choices.size(); ++c) lls.push_back(res[k++].logprob);
    const ChoiceScores s = score_choices(lls, doc.choices, doc.gold);
    acc.push_back(s.acc);
    acc_norm.push_back(s.acc_norm);
  }
  add_mean_metric(o, "acc", acc);
  add_mean_metric(o, "acc_norm", acc_norm);
  return o;
}

TaskOutcome run_rolling(const EvalTask& t, size_t n_docs, const io::BpeTokenizer& tok, const LmEvaluationOptions& opt,
                        const ScoreLoglikelihood& score, MPI_Comm comm) {
  const int32_t prefix = prefix_token(tok);
  std::vector<LoglikelihoodRequest> reqs;
  std::vector<size_t> windows_of(n_docs);
  for (size_t d = 0; d < n_docs; ++d) {
    std::vector<LoglikelihoodRequest> w = rolling_windows(harness_encode(tok, t.docs[d].text), prefix, opt.max_length);
    windows_of[d] = w.size();
    for (auto& r : w) reqs.push_back(std::move(r));
  }
  const std::vector<LoglikelihoodResult> res = score_distributed(reqs, score, comm);
  TaskOutcome o;
  if (res.empty() && !reqs.empty()) return o;
  // weighted_perplexity and bits_per_byte aggregate (loglikelihood, weight) pairs: sums over documents.
  double ll = 0, words = 0, bytes = 0;
  size_t k = 0;
  for (size_t d = 0; d < n_docs; ++d) {
    double doc_ll = 0;
    for (size_t w = 0; w < windows_of[d]; ++w) doc_ll += res[k++].logprob;
    ll += doc_ll;
    words += double(count_words(t.docs[d].text));
    bytes += double(t.docs[d].text.size());
  }
  o.metrics["word_perplexity,none"] = number_or_na(std::exp(-ll / words));
  o.metrics["word_perplexity_stderr,none"] = "N/A";
  o.metrics["byte_perplexity,none"] = number_or_na(std::exp(-ll / bytes));
  o.metrics["byte_perplexity_stderr,none"] = "N/A";
  o.metrics["bits_per_byte,none"] = number_or_na(-ll / bytes / std::log(2.0));
  o.metrics["bits_per_byte_stderr,none"] = "N/A";
  o.higher_is_better["word_perplexity"] = false;
  o.higher_is_better["byte_perplexity"] = false;
  o.higher_is_better["bits_per_byte"] = false;
  return o;
}

TaskOutcome run_generate_until(const EvalTask& t, size_t n_docs, const io::BpeTokenizer& tok,
                               const LmEvaluationOptions& opt, const GreedyGenerate& generate, MPI_Comm comm) {
  ZP_REQUIRE(bool(generate), t.path, ": a generate_until task, but this evaluation has no generator");
  const int64_t max_ctx = opt.max_length - t.max_gen_toks;
  ZP_REQUIRE(max_ctx > 0, t.path, ": field 'max_gen_toks' (", t.max_gen_toks,
             ") must be less than the model's context of ", opt.max_length, " tokens");
  // The harness appends the EOS token's text to the stop strings.
  std::vector<std::string> until = t.until;
  if (tok.eos_id()) {
    const int32_t eos = *tok.eos_id();
    until.push_back(tok.decode(std::span<const int32_t>(&eos, 1)));
  }
  std::vector<GenerationAsk> asks;
  for (size_t d = 0; d < n_docs; ++d) {
    // tok_batch_encode: the tokenizer's default special tokens, the context's last max_ctx tokens.
    std::vector<int32_t> ids = tok.encode(t.docs[d].context, {.add_special = true});
    if (tok.bos_id() && tok.adds_bos()) {
      const int32_t bos = *tok.bos_id();
      const std::string bos_text = tok.decode(std::span<const int32_t>(&bos, 1));
      if (t.docs[d].context.substr(0, bos_text.size()) == bos_text) ids = tok.encode(t.docs[d].context, {});
    }
    if (int64_t(ids.size()) > max_ctx) ids.erase(ids.begin(), ids.end() - std::ptrdiff_t(max_ctx));
    ZP_REQUIRE(!ids.empty(), t.path, ":", t.docs[d].line, ": the context encodes to no token");
    asks.push_back({std::move(ids), until, t.max_gen_toks});
  }
  const std::vector<std::string> res = generate_distributed(asks, generate, comm);
  TaskOutcome o;
  if (res.empty() && !asks.empty()) return o;
  std::vector<double> em;
  for (size_t d = 0; d < n_docs; ++d) {
    std::string s = res[d];
    for (const auto& term : until)
      if (!term.empty()) s = s.substr(0, std::min(s.size(), s.find(term)));
    em.push_back(s == t.docs[d].target ? 1.0 : 0.0);
  }
  add_mean_metric(o, "exact_match", em);
  return o;
}

}  // namespace

ojson evaluate_tasks(const std::vector<EvalTask>& tasks, const io::BpeTokenizer& tok, const LmEvaluationOptions& opt,
                     const ScoreLoglikelihood& score, const GreedyGenerate& generate, MPI_Comm comm) {
  ZP_REQUIRE(opt.max_length >= 1, "the evaluation's max_length must be at least 1, got ", opt.max_length);
  int rank = 0;
  ZP_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  ojson results = ojson::object(), subtasks = ojson::object(), configs = ojson::object(), versions = ojson::object(),
        nshot = ojson::object(), hib = ojson::object(), nsamples = ojson::object();
  for (const EvalTask& t : tasks) {
    ZP_REQUIRE(!results.contains(t.name), t.path, ": task '", t.name, "' is also the name of an earlier task file");
    const size_t n = opt.limit < 0 ? t.docs.size() : std::min(t.docs.size(), size_t(opt.limit));
    TaskOutcome o;
    switch (t.output_type) {
      case EvalOutputType::MultipleChoice: o = run_multiple_choice(t, n, tok, opt, score, comm); break;
      case EvalOutputType::LoglikelihoodRolling: o = run_rolling(t, n, tok, opt, score, comm); break;
      case EvalOutputType::GenerateUntil: o = run_generate_until(t, n, tok, opt, generate, comm); break;
    }
    ojson r = ojson::object();
    r["alias"] = t.name;
    for (auto& [k, v] : o.metrics.items()) r[k] = v;
    results[t.name] = r;
    subtasks[t.name] = ojson::array();
    ojson c = ojson::object();
    c["task"] = t.name;
    c["task_file"] = t.path;
    c["output_type"] = output_type_name(t.output_type);
    c["target_delimiter"] = t.target_delimiter;
    c["fewshot_delimiter"] = t.fewshot_delimiter;
    c["num_fewshot"] = 0;
    if (t.output_type == EvalOutputType::GenerateUntil)
      c["generation_kwargs"] = {{"until", t.until}, {"max_gen_toks", t.max_gen_toks}, {"do_sample", false}};
    ojson metric_list = ojson::array();
    for (auto& [k, v] : o.higher_is_better.items()) metric_list.push_back({{"metric", k}, {"higher_is_better", v}});
    c["metric_list"] = metric_list;
    configs[t.name] = c;
    versions[t.name] = t.version ? ojson(*t.version) : ojson(nullptr);
    nshot[t.name] = 0;
    hib[t.name] = o.higher_is_better;
    nsamples[t.name] = {{"original", t.docs.size()}, {"effective", n}};
  }
  if (rank != 0) return nullptr;
  ojson out = ojson::object();
  out["results"] = results;
  out["group_subtasks"] = subtasks;
  out["configs"] = configs;
  out["versions"] = versions;
  out["n-shot"] = nshot;
  out["higher_is_better"] = hib;
  out["n-samples"] = nsamples;
  out["config"] = opt.config;
  return out;
}

std::string results_table(const ojson& results) {
  struct Row { std::string task, version, filter, nshot, metric, arrow, value, pm, stderr_; };
  std::vector<Row> rows;
  auto fmt = [](const ojson& v) {
    if (!v.is_number()) return v.is_string() ? v.get<std::string>() : std::string("N/A");
    char b[64];
    std::snprintf(b, sizeof(b), "%.4f", v.get<double>());
    return std::string(b);
  };
  for (auto& [task, r] : results.at("results").items()) {
    const ojson& v = results.at("versions").at(task);
    std::string version = v.is_null() ? "N/A" : fmt(v);
    if (v.is_number() && v.get<double>() == std::floor(v.get<double>())) version = std::to_string(int64_t(v.get<double>()));
    bool first = true;
    for (auto& [key, value] : r.items()) {
      if (key == "alias" || key.find("_stderr,") != std::string::npos) continue;
      const std::string metric = key.substr(0, key.find(','));
      const std::string filter = key.substr(key.find(',') + 1);
      const std::string se_key = metric + "_stderr," + filter;
      const ojson& hib = results.at("higher_is_better").at(task);
      const std::string arrow = hib.contains(metric) ? (hib.at(metric).get<bool>() ? "↑" : "↓") : "";
      const std::string se = r.contains(se_key) ? fmt(r.at(se_key)) : "N/A";
      rows.push_back({first ? task : "", first ? version : "", filter, first ? "0" : "", metric, arrow, fmt(value),
                      se == "N/A" ? "" : "±", se == "N/A" ? "N/A" : se});
      first = false;
    }
  }
  const std::vector<std::string> head = {"Tasks", "Version", "Filter", "n-shot", "Metric", "", "Value", "", "Stderr"};
  const std::vector<bool> right = {false, true, false, true, false, false, true, false, true};
  std::vector<size_t> w(head.size());
  auto cells = [](const Row& r) {
    return std::vector<std::string>{r.task, r.version, r.filter, r.nshot, r.metric, r.arrow, r.value, r.pm, r.stderr_};
  };
  // Display width: the arrows and ± are one column each but several bytes.
  auto width = [](const std::string& s) { return size_t(utf8_characters(s)); };
  for (size_t i = 0; i < head.size(); ++i) w[i] = std::max<size_t>(width(head[i]), 1);
  for (const auto& r : rows) {
    const auto c = cells(r);
    for (size_t i = 0; i < c.size(); ++i) w[i] = std::max(w[i], width(c[i]));
  }
  auto line = [&](const std::vector<std::string>& c) {
    std::string s = "|";
    for (size_t i = 0; i < c.size(); ++i) {
      const std::string pad(w[i] - width(c[i]), ' ');
      s += right[i] ? pad + c[i] : c[i] + pad;
      s += "|";
    }
    return s + "\n";
  };
  std::string out = line(head) + "|";
  for (size_t i = 0; i < head.size(); ++i) out += (right[i] ? std::string(w[i] - 1, '-') + ":" : std::string(w[i], '-')) + "|";
  out += "\n";
  for (const auto& r : rows) out += line(cells(r));
  return out;
}

}  // namespace zp::runtime
