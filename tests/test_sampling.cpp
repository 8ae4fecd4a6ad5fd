// Token sampling: the CPU reference on hand-built rows (greedy, the draw's distribution, temperature,
// top-k, top-p, repetition penalty as HF applies them, determinism, logprobs, bad arguments), and
// the CUDA version against it on random rows with mixed settings, token for token.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "kernels/sampling.h"
#include "test_util.h"

namespace zp::test {
using namespace zp::kernels;

namespace {

// A batch built row by row; padding columns hold a huge value that must never win.
struct Batch {
  int64_t V, ld;
  std::vector<float> logits;
  std::vector<SamplingParams> params;
  std::vector<int32_t> history;
  std::vector<int64_t> starts{0};

  Batch(int64_t v, int64_t l) : V(v), ld(l) {}
  int64_t S() const { return int64_t(params.size()); }
  void add(const std::vector<float>& row, const SamplingParams& p, const std::vector<int32_t>& hist = {}) {
    EXPECT_EQ(int64_t(row.size()), V);
    logits.insert(logits.end(), row.begin(), row.end());
    logits.resize(logits.size() + size_t(ld - V), 1e30f);
    params.push_back(p);
    history.insert(history.end(), hist.begin(), hist.end());
    starts.push_back(int64_t(history.size()));
  }
};

// The CPU reference over the batch, with the logits stored as dt.
std::vector<int32_t> cpu_sample(const Batch& b, DType dt = DType::F32, std::vector<float>* logprobs = nullptr) {
  std::vector<int32_t> tokens(size_t(b.S()), -7);
  if (logprobs) logprobs->assign(size_t(b.S()), NAN);
  float* lp = logprobs ? logprobs->data() : nullptr;
  auto run = [&](void* x) {
    cpu::sample_tokens(nullptr, dt, tokens.data(), lp, x, b.S(), b.V, b.ld, b.params.data(), b.history.data(),
                       b.starts.data());
  };
  std::vector<float> f32 = b.logits;
  std::vector<double> f64(b.logits.begin(), b.logits.end());
  std::vector<bf16> h16(b.logits.begin(), b.logits.end());
  if (dt == DType::F64) run(f64.data());
  else if (dt == DType::BF16) run(h16.data());
  else run(f32.data());
  return tokens;
}

int32_t sample_one(const std::vector<float>& row, const SamplingParams& p, const std::vector<int32_t>& hist = {},
                   float* logprob = nullptr) {
  Batch b(int64_t(row.size()), int64_t(row.size()) + 3);
  b.add(row, p, hist);
  std::vector<float> lp;
  auto t = cpu_sample(b, DType::F32, logprob ? &lp : nullptr);
  if (logprob) *logprob = lp[0];
  return t[0];
}

SamplingParams sampled(float temperature, uint64_t seed = 1234, uint64_t draw = 0) {
  SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  p.draw = draw;
  return p;
}

// Counts of the tokens drawn for draw = 0 .. n-1.
std::vector<int64_t> histogram(const std::vector<float>& row, SamplingParams p, int64_t n,
                               const std::vector<int32_t>& hist = {}) {
  Batch b(int64_t(row.size()), int64_t(row.size()));
  for (int64_t d = 0; d < n; ++d) {
    p.draw = uint64_t(d);
    b.add(row, p, hist);
  }
  std::vector<int64_t> counts(row.size(), 0);
  for (int32_t t : cpu_sample(b)) counts[size_t(t)]++;
  return counts;
}

std::vector<double> softmax(const std::vector<float>& row, double temperature) {
  double mx = -INFINITY, z = 0;
  for (float x : row) mx = std::max(mx, double(x) / temperature);
  std::vector<double> p(row.size());
  for (size_t i = 0; i < row.size(); ++i) z += p[i] = std::exp(double(row[i]) / temperature - mx);
  for (double& x : p) x /= z;
  return p;
}

// Pearson's statistic of the counts against the probabilities (cells of probability 0 must be empty).
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& probs) {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  double chi = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (probs[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0";
      continue;
    }
    const double e = double(n) * probs[i];
    chi += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
  }
  return chi;
}
// Far beyond the 99.99% point of chi-square with up to 9 degrees of freedom (33.7): a wrong
// distribution over 20000 draws lands in the hundreds.
constexpr double kChiBound = 40;

}  // namespace

TEST(SamplingCpu, UniformIsDeterministicAndSpread) {
  EXPECT_EQ(sampling_uniform(5, 9), sampling_uniform(5, 9));
  EXPECT_NE(sampling_uniform(5, 9), sampling_uniform(5, 10));
  EXPECT_NE(sampling_uniform(5, 9), sampling_uniform(6, 9));
  double sum = 0;
  std::vector<int> deciles(10, 0);
  for (uint64_t d = 0; d < 100000; ++d) {
    const double u = sampling_uniform(42, d);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    deciles[size_t(u * 10)]++;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.005);
  for (int c : deciles) EXPECT_NEAR(c, 10000, 500);
}

TEST(SamplingCpu, GreedyIsArgmaxLowestIndexIgnoringPadding) {
  // Two equal maxima (1 and 3): the lower index wins; padding holds 1e30 and is never chosen.
  const std::vector<float> row = {1.f, 3.f, 2.f, 3.f, -1.f};
  for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
    Batch b(5, 8);
    SamplingParams greedy;
    greedy.top_k = 2;  // ignored at temperature 0, as is top_p
    greedy.top_p = 0.5f;
    b.add(row, greedy);
    b.add({-5.f, -4.f, -INFINITY, -4.5f, -4.f}, SamplingParams{});
    auto t = cpu_sample(b, dt);
    EXPECT_EQ(t[0], 1) << dtype_name(dt);
    EXPECT_EQ(t[1], 1) << dtype_name(dt);
  }
}

TEST(SamplingCpu, DrawsFollowTheSoftmaxAtEachTemperature) {
  const std::vector<float> row = {0.5f, -1.f, 2.f, 0.f, 1.f, -0.3f};
  for (float temp : {1.f, 0.5f, 2.f}) {
    auto counts = histogram(row, sampled(temp), 20000);
    EXPECT_LT(chi_square(counts, softmax(row, temp)), kChiBound) << "temperature " << temp;
  }
  // A wrong temperature is caught by the same statistic (the test has power).
  EXPECT_GT(chi_square(histogram(row, sampled(1.f), 20000), softmax(row, 1.3)), 10 * kChiBound);
}

TEST(SamplingCpu, TopKKeepsTheKBestAndTheirTies) {
  const std::vector<float> row = {0.3f, 1.5f, -0.2f, 1.1f, 0.9f, 2.0f, -1.f, 0.95f};
  SamplingParams p = sampled(1.f);
  p.top_k = 3;  // tokens 5, 1, 3
  auto counts = histogram(row, p, 20000);
  std::vector<double> probs(row.size(), 0.0);
  double z = 0;
  for (int i : {5, 1, 3}) z += probs[size_t(i)] = std::exp(double(row[size_t(i)]));
  for (double& x : probs) x /= z;
  EXPECT_LT(chi_square(counts, probs), kChiBound);  // also: every other token drawn 0 times

  // Ties at the threshold are kept: the 2nd largest value is shared by tokens 1 and 2.
  const std::vector<float> tied = {5.f, 4.f, 4.f, 1.f, 0.f};
  p.top_k = 2;
  counts = histogram(tied, p, 5000);
  EXPECT_GT(counts[2], 0);
  EXPECT_EQ(counts[3] + counts[4], 0);
  // top_k >= V is off.
  p.top_k = 5;
  EXPECT_LT(chi_square(histogram(tied, p, 20000), softmax(tied, 1.0)), kChiBound);
  p.top_k = 6;
  EXPECT_LT(chi_square(histogram(tied, p, 20000), softmax(tied, 1.0)), kChiBound);
}

TEST(SamplingCpu, TopPKeepsTheSmallestSetReachingTheMass) {
  // Probabilities 0.05, 0.5, 0.15, 0.3 (out of order, so vocabulary order differs from probability order).
  const std::vector<double> probs = {0.05, 0.5, 0.15, 0.3};
  std::vector<float> row;
  for (double q : probs) row.push_back(float(std::log(q)));
  auto kept = [&](float top_p) {
    SamplingParams p = sampled(1.f);
    p.top_p = top_p;
    auto counts = histogram(row, p, 4000);
    std::set<int> s;
    for (size_t i = 0; i < counts.size(); ++i)
      if (counts[i]) s.insert(int(i));
    return s;
  };
  EXPECT_EQ(kept(0.4f), (std::set<int>{1}));
  EXPECT_EQ(kept(0.5f), (std::set<int>{1}));  // exactly reached: kept alone
  EXPECT_EQ(kept(0.79f), (std::set<int>{1, 3}));
  EXPECT_EQ(kept(0.8f), (std::set<int>{1, 3}));  // 0.5 + 0.3 reaches 0.8f despite rounding
  EXPECT_EQ(kept(0.81f), (std::set<int>{1, 2, 3}));
  EXPECT_EQ(kept(0.96f), (std::set<int>{0, 1, 2, 3}));

  // The kept tokens are drawn with their renormalised probabilities.
  SamplingParams p = sampled(1.f);
  p.top_p = 0.81f;
  EXPECT_LT(chi_square(histogram(row, p, 20000), {0, 0.5 / 0.95, 0.15 / 0.95, 0.3 / 0.95}), kChiBound);

  // Equal probabilities are kept or dropped together: 0.4, 0.2, 0.2, 0.2 at top_p 0.5 keeps all four
  // (HF's sort would keep 0.4 and one of the 0.2s).
  std::vector<float> tied = {float(std::log(0.4)), float(std::log(0.2)), float(std::log(0.2)), float(std::log(0.2))};
  p.top_p = 0.5f;
  auto counts = histogram(tied, p, 4000);
  for (int64_t c : counts) EXPECT_GT(c, 0);
  // top_p below the largest probability keeps that token alone.
  p.top_p = 0.01f;
  counts = histogram(tied, p, 200);
  EXPECT_EQ(counts[0], 200);
}

namespace {

// Random rows of several shapes for top-p: smooth (wide and narrow softmax), ties (a few levels
// only), near-uniform (a kept set far above kTopPCandidates) and one dominant token.
std::vector<float> top_p_row(int kind, int64_t V, uint64_t seed) {
  std::vector<float> row = randn(size_t(V), seed, kind == 0 ? 1.f : kind == 1 ? 4.f : 0.05f);
  if (kind == 3)
    for (float& x : row) x = std::round(x * 40.f) / 8.f;  // ~20 levels: long runs of equal weights
  if (kind == 4) row[size_t(seed % uint64_t(V))] = 30.f;
  return row;
}

}  // namespace

// cpu::top_p_threshold sorts only the heaviest candidates first; any number of candidates must give
// the full sort's threshold (the walk before candidates existed) to the bit, including where the
// candidates end inside a run of ties and where the kept set is larger than the candidates.
TEST(SamplingCpu, TopPFromTheHeaviestCandidatesEqualsTheFullSort) {
  const std::vector<float> top_ps = {1e-6f, 0.01f, 0.3f, 0.5f, 0.8f, 0.9f, 0.95f, 0.999f, 0.9999f,
                                     std::nextafter(1.f, 0.f)};
  int64_t cases = 0, beyond_candidates = 0;
  for (int64_t V : {1, 2, 7, 300, 5000, 128256}) {
    for (int kind = 0; kind < 5; ++kind) {
      const std::vector<float> row = top_p_row(kind, V, uint64_t(V * 10 + kind));
      const double mx = *std::max_element(row.begin(), row.end());
      std::vector<double> w(row.size());
      double z = 0;
      for (size_t c = 0; c < row.size(); ++c) z += w[c] = row[c] == mx ? 1.0 : std::exp(double(row[c]) - mx);
      for (float top_p : top_ps) {
        const double full = cpu::top_p_threshold(w, z, top_p, V);
        int64_t kept = 0;
        for (double x : w) kept += x >= full;
        beyond_candidates += kept > kTopPCandidates;
        for (int64_t candidates : {int64_t(1), int64_t(2), int64_t(3), int64_t(64), kTopPCandidates}) {
          EXPECT_EQ(cpu::top_p_threshold(w, z, top_p, candidates), full)
              << "V " << V << " kind " << kind << " top_p " << top_p << " candidates " << candidates;
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(beyond_candidates, 0) << "no case needed more than the first candidates";
  std::printf("%lld thresholds compared, %lld kept sets beyond %lld candidates\n", (long long)cases,
              (long long)beyond_candidates, (long long)kTopPCandidates);
}

TEST(SamplingCpu, TopKThenTopPThenTemperatureOrder) {
  // Temperature applies before top-p: at T = 0.2 the probabilities sharpen (0.918 for token 0) so
  // top_p = 0.9 keeps one token; at T = 1 it would keep three.
  const std::vector<float> row = {1.f, 0.f, 0.5f, -1.f};
  SamplingParams p = sampled(0.2f);
  p.top_p = 0.9f;
  auto counts = histogram(row, p, 2000);
  EXPECT_EQ(counts[0], 2000);
  // top-k before top-p: with k = 2 the mass is renormalised over {0, 2}, of which 0 holds 0.62 at T = 1.
  p = sampled(1.f);
  p.top_k = 2;
  p.top_p = 0.6f;
  counts = histogram(row, p, 2000);
  EXPECT_EQ(counts[0], 2000);
  p.top_p = 0.7f;
  counts = histogram(row, p, 2000);
  EXPECT_GT(counts[2], 0);
  EXPECT_EQ(counts[1] + counts[3], 0);
}

TEST(SamplingCpu, RepetitionPenaltyAsHuggingFace) {
  SamplingParams p;
  p.repetition_penalty = 1.5f;
  // Positive logits are divided: 2.0 / 1.5 = 1.33 still beats 1.2, but only if token 0 is penalised
  // once (2.0 / 1.5^2 = 0.89 would lose).
  EXPECT_EQ(sample_one({2.f, 1.2f, -3.f}, p, {0, 0, 0}), 0);
  p.repetition_penalty = 2.f;
  EXPECT_EQ(sample_one({2.f, 1.2f, -3.f}, p, {0}), 1);
  // Negative logits are multiplied: -1.0 * 1.5 = -1.5 loses to -1.2 (dividing would have kept it).
  p.repetition_penalty = 1.5f;
  EXPECT_EQ(sample_one({-1.f, -1.2f, -5.f}, p, {0, 2}), 1);
  EXPECT_EQ(sample_one({-1.f, -1.2f, -5.f}, p, {2}), 0);
  // A penalty below 1 encourages: 1.0 / 0.5 = 2.0 beats 1.5.
  p.repetition_penalty = 0.5f;
  EXPECT_EQ(sample_one({1.f, 1.5f}, p, {0}), 0);
  // The draw sees the penalised logits: tokens 0 and 1 swap probabilities.
  SamplingParams s = sampled(1.f);
  s.repetition_penalty = 2.f;
  const std::vector<float> row = {2.f, 1.f, 0.f};
  auto counts = histogram(row, s, 20000, {0, 0});
  EXPECT_LT(chi_square(counts, softmax({1.f, 1.f, 0.f}, 1.0)), kChiBound);
}

TEST(SamplingCpu, DrawDependsOnSeedAndDrawOnly) {
  auto row = randn(50, 3, 2.f);
  SamplingParams p = sampled(0.9f, 77, 5);
  p.top_k = 20;
  const int32_t alone = sample_one(row, p);
  // The same row at position 2 of a batch, among rows of other settings and contents.
  Batch b(50, 56);
  b.add(randn(50, 4), sampled(1.f, 77, 6));
  b.add(randn(50, 5), SamplingParams{});
  b.add(row, p);
  SamplingParams other = sampled(0.5f, 1, 1);
  other.repetition_penalty = 1.3f;
  b.add(randn(50, 6), other, {3, 4, 3});
  EXPECT_EQ(cpu_sample(b)[2], alone);
  EXPECT_EQ(sample_one(row, p), alone);
  // Other draws and other seeds reach other tokens.
  std::set<int32_t> seen;
  for (uint64_t d = 0; d < 40; ++d) seen.insert(sample_one(row, sampled(0.9f, 77, d)));
  for (uint64_t s = 0; s < 40; ++s) seen.insert(sample_one(row, sampled(0.9f, s, 5)));
  EXPECT_GT(seen.size(), 5u);
}

TEST(SamplingCpu, LogprobIsTheRawLogSoftmaxAtTheChosenToken) {
  const auto row = randn(40, 11, 2.f);
  SamplingParams p = sampled(0.7f, 3, 9);
  p.top_k = 10;
  p.top_p = 0.9f;
  p.repetition_penalty = 1.3f;
  const std::vector<int32_t> hist = {1, 5, 5, 17};
  std::vector<double> ref = softmax(row, 1.0);
  for (DType dt : {DType::F64, DType::F32}) {
    Batch b(40, 48);
    b.add(row, p, hist);
    b.add(row, SamplingParams{}, hist);  // greedy
    std::vector<float> lp;
    auto t = cpu_sample(b, dt, &lp);
    for (int r = 0; r < 2; ++r) EXPECT_NEAR(lp[size_t(r)], std::log(ref[size_t(t[size_t(r)])]), 1e-5) << dtype_name(dt);
  }
}

TEST(SamplingCpu, BadArgumentsThrow) {
  const std::vector<float> row = {0.f, 1.f, 2.f};
  auto with = [&](auto change) {
    SamplingParams p;
    change(p);
    return [=] { sample_one(row, p, {}); };
  };
  expect_error(with([](SamplingParams& p) { p.temperature = -1.f; }), {"temperature"});
  expect_error(with([](SamplingParams& p) { p.temperature = NAN; }), {"temperature"});
  expect_error(with([](SamplingParams& p) { p.top_p = 0.f; }), {"top_p"});
  expect_error(with([](SamplingParams& p) { p.top_p = 1.5f; }), {"top_p"});
  expect_error(with([](SamplingParams& p) { p.repetition_penalty = 0.f; }), {"repetition_penalty"});
  expect_error(with([](SamplingParams& p) { p.top_k = -1; }), {"top_k"});
}

TEST(SamplingCpu, BadSizesAndHistoryAreFatal) {
  std::vector<float> x = {0.f, 1.f, 2.f};
  int32_t tok;
  SamplingParams pen;
  pen.repetition_penalty = 1.2f;
  EXPECT_DEATH(sample_one(x, pen, {0, 3}), "history token 3 out of range for vocabulary 3");
  EXPECT_DEATH(cpu::sample_tokens(nullptr, DType::F32, &tok, nullptr, x.data(), 1, 3, 3, &pen, nullptr, nullptr),
               "no history");
  SamplingParams ok;
  EXPECT_DEATH(cpu::sample_tokens(nullptr, DType::F32, &tok, nullptr, x.data(), 1, 3, 2, &ok, nullptr, nullptr), "ld 2");
}

// --- CUDA against the CPU reference.

namespace {

Tensor upload_bytes(const void* p, size_t n) {
  Tensor h = Tensor::empty({int64_t(std::max<size_t>(n, 1))}, DType::U8, Device::cpu());
  if (n) std::memcpy(h.data(), p, n);
  return h.to(Device::cuda(0));
}

// Mixed settings, row i takes setting i % count; every row gets its own seed and draw.
SamplingParams mixed(int64_t i, int64_t V) {
  SamplingParams p;
  switch (i % 12) {
    case 0: break;                                                              // greedy
    case 1: p.repetition_penalty = 1.3f; break;                                 // greedy, penalised
    case 2: p.temperature = 1.f; break;
    case 3: p.temperature = 0.7f; break;
    case 4: p.temperature = 1.3f, p.top_k = 50; break;
    case 5: p.temperature = 1.f, p.top_k = 1; break;
    case 6: p.temperature = 1.f, p.top_p = 0.9f; break;
    case 7: p.temperature = 0.8f, p.top_k = 100, p.top_p = 0.5f; break;
    case 8: p.temperature = 0.9f, p.top_p = 0.95f, p.repetition_penalty = 1.2f; break;
    case 9: p.temperature = 1.1f, p.top_k = int32_t(V + 5), p.repetition_penalty = 0.8f; break;
    case 10: p.temperature = 0.6f, p.top_k = 3, p.top_p = 0.99f, p.repetition_penalty = 1.5f; break;
    case 11: p.temperature = 2.f, p.top_p = 0.3f; break;
  }
  p.seed = 1000 + uint64_t(i) * 7919;
  p.draw = uint64_t(i) * 3 + 1;
  return p;
}

}  // namespace

TEST(SamplingGpu, MatchesCpu) {
  ZP_SKIP_WITHOUT_GPU();
  struct Case { int64_t S, V, ld; };
  // Packs when ld allows them; ld = 7 takes the element-by-element path.
  for (Case c : {Case{48, 50257, 50304}, Case{36, 151936, 151936}, Case{24, 7, 8}, Case{24, 7, 7}}) {
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE("S=" + std::to_string(c.S) + " V=" + std::to_string(c.V) + " ld=" + std::to_string(c.ld) + " " +
                   std::string(dtype_name(dt)));
      Batch b(c.V, c.ld);
      std::mt19937_64 g(uint64_t(c.V + c.S));
      for (int64_t i = 0; i < c.S; ++i) {
        auto row = round_to(randn(size_t(c.V), uint64_t(c.V * 31 + i), 3.f), dt);
        std::vector<int32_t> hist(size_t(g() % 40));
        for (auto& t : hist) t = int32_t(g() % uint64_t(c.V));
        if (hist.size() > 2) hist[1] = hist[0];  // a repeated token, penalised once
        // Penalise the current favourite sometimes, so the penalty decides.
        if (i % 12 == 1 || g() % 2) hist.push_back(int32_t(std::max_element(row.begin(), row.end()) - row.begin()));
        b.add(row, mixed(i, c.V), hist);
      }
      std::vector<float> ref_lp;
      auto ref = cpu_sample(b, DType::F32, &ref_lp);  // the stored values, so both see the same inputs

      Tensor g_logits = upload(b.logits, dt);
      Tensor g_params = upload_bytes(b.params.data(), b.params.size() * sizeof(SamplingParams));
      std::vector<float> hist_f(b.history.begin(), b.history.end()), starts_f(b.starts.begin(), b.starts.end());
      Tensor g_hist = upload(hist_f.empty() ? std::vector<float>{0.f} : hist_f, DType::I32);
      Tensor g_starts = upload(starts_f, DType::I64);
      Tensor g_tokens = Tensor::empty({c.S}, DType::I32, Device::cuda());
      Tensor g_lp = Tensor::empty({c.S}, DType::F32, Device::cuda());
      auto run = [&](float* lp) {
        cuda::sample_tokens(nullptr, dt, g_tokens.data<int32_t>(), lp, g_logits.data(), c.S, c.V, c.ld,
                            static_cast<const SamplingParams*>(g_params.data()), g_hist.data<int32_t>(),
                            g_starts.data<int64_t>());
        auto f = download(g_tokens);
        return std::vector<int32_t>(f.begin(), f.end());
      };
      auto got = run(g_lp.data<float>());
      auto lp = download(g_lp);
      for (int64_t i = 0; i < c.S; ++i) {
        EXPECT_EQ(got[size_t(i)], ref[size_t(i)]) << "row " << i << " (setting " << i % 12 << ")";
        EXPECT_NEAR(lp[size_t(i)], ref_lp[size_t(i)], dt == DType::F32 ? 1e-4 : 2e-4) << "logprob, row " << i;
      }
      EXPECT_EQ(run(nullptr), got) << "without logprobs, and deterministic";
      EXPECT_EQ(download(g_logits), round_to(b.logits, dt)) << "the logits are left as they were";
    }
  }
}

// Top-p over Llama 3's vocabulary at the extremes of top_p and with runs of tied logits: the CUDA
// radix selection keeps what the CPU's (candidate-sorting) walk keeps, token for token.
TEST(SamplingGpu, TopPMatchesCpuOnALargeVocabulary) {
  ZP_SKIP_WITHOUT_GPU();
  const int64_t V = 128256;
  const std::vector<float> top_ps = {1e-6f, 0.01f, 0.5f, 0.9f, 0.999f, 0.9999f};
  for (DType dt : {DType::F32, DType::BF16}) {
    Batch b(V, V);
    for (int kind = 0; kind < 5; ++kind)
      for (size_t i = 0; i < top_ps.size(); ++i) {
        SamplingParams p = sampled(kind == 2 ? 1.f : 0.7f, 77 + uint64_t(kind) * 13 + i, i);
        p.top_p = top_ps[i];
        b.add(round_to(top_p_row(kind, V, uint64_t(kind * 100 + int(i))), dt), p);
      }
    const std::vector<int32_t> ref = cpu_sample(b, DType::F32);
    Tensor g_logits = upload(b.logits, dt);
    Tensor g_params = upload_bytes(b.params.data(), b.params.size() * sizeof(SamplingParams));
    Tensor g_tokens = Tensor::empty({b.S()}, DType::I32, Device::cuda());
    cuda::sample_tokens(nullptr, dt, g_tokens.data<int32_t>(), nullptr, g_logits.data(), b.S(), V, V,
                        static_cast<const SamplingParams*>(g_params.data()), nullptr, nullptr);
    const std::vector<float> got = download(g_tokens);
    for (int64_t r = 0; r < b.S(); ++r)
      EXPECT_EQ(int32_t(got[size_t(r)]), ref[size_t(r)])
          << dtype_name(dt) << " row " << r << " top_p " << b.params[size_t(r)].top_p;
  }
}

TEST(SamplingGpu, DrawsFollowTheSoftmaxWithoutHistory) {
  ZP_SKIP_WITHOUT_GPU();
  // Many rows of one small distribution, history pointers null: the CUDA draws pass the same test as the CPU's.
  const std::vector<float> row = {0.5f, -1.f, 2.f, 0.f, 1.f, -0.3f};
  const int64_t S = 20000, V = 6;
  std::vector<float> logits;
  std::vector<SamplingParams> params;
  for (int64_t d = 0; d < S; ++d) {
    logits.insert(logits.end(), row.begin(), row.end());
    params.push_back(sampled(1.f, 99, uint64_t(d)));
  }
  Tensor g_logits = upload(logits, DType::F32);
  Tensor g_params = upload_bytes(params.data(), params.size() * sizeof(SamplingParams));
  Tensor g_tokens = Tensor::empty({S}, DType::I32, Device::cuda());
  cuda::sample_tokens(nullptr, DType::F32, g_tokens.data<int32_t>(), nullptr, g_logits.data(), S, V, V,
                      static_cast<const SamplingParams*>(g_params.data()), nullptr, nullptr);
  std::vector<int64_t> counts(size_t(V), 0);
  for (float t : download(g_tokens)) counts[size_t(t)]++;
  EXPECT_LT(chi_square(counts, softmax(row, 1.0)), kChiBound);
}

}  // namespace zp::test
