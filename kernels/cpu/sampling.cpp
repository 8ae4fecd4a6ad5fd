// The reference sampler: one row at a time in double, with the sorts a reader expects (top-k by
// nth_element, top-p by walking the kept tokens from the most probable down, sorting only as many of
// the most probable as the walk needs: top_p_threshold), so that the CUDA
// version, which finds the same thresholds by radix selection, has something plain to be checked
// against. The only subtle point is the draw: it walks the kept tokens in vocabulary order, not in
// probability order, so that the CUDA version can find the same token with one prefix sum.
#include <algorithm>
#include <cmath>
#include <functional>
#include <span>
#include <vector>

#include "kernels/sampling.h"
#include "kernels/sampling_hash.h"

namespace zp::kernels {

// ZP_REQUIRE, not ZP_CHECK: the settings come from a user's request, which a server rejects rather
// than dying over.
void check_sampling_params(const SamplingParams& p) {
  ZP_REQUIRE(p.temperature >= 0.f && std::isfinite(p.temperature), "sampling temperature ", p.temperature,
           " must be finite and >= 0");
  ZP_REQUIRE(p.top_k >= 0, "sampling top_k ", p.top_k, " must be >= 0");
  ZP_REQUIRE(p.top_p > 0.f && p.top_p <= 1.f, "sampling top_p ", p.top_p, " must be in (0, 1]");
  ZP_REQUIRE(p.repetition_penalty > 0.f && std::isfinite(p.repetition_penalty), "sampling repetition_penalty ",
           p.repetition_penalty, " must be finite and > 0");
}

double sampling_uniform(uint64_t seed, uint64_t draw) { return sampling_uniform_bits(seed, draw); }

namespace cpu {

// Runs of equal weight are added from the heaviest down until their mass reaches top_p; the last run
// added sets the threshold, so it is kept whole. Only the `candidates` heaviest weights are sorted
// (nth_element, then a sort of those): their order is the full sort's first `candidates`, so the
// walk adds the same numbers in the same order and finds the same threshold when it stops among them
// (also in a run that the candidates cut: if its part reaches top_p, all of it does, and the run's
// level is the threshold either way). When their mass falls short, eight times as many are tried,
// then (from half the row on) all of them: a flat distribution pays two partial selections more.
double top_p_threshold(std::span<const double> kept_weights, double z, float top_p, int64_t candidates) {
  ZP_CHECK(!kept_weights.empty() && candidates > 0, "top_p_threshold: ", kept_weights.size(), " weights, ",
           candidates, " candidates");
  const int64_t n = int64_t(kept_weights.size());
  std::vector<double> sorted(kept_weights.begin(), kept_weights.end());
  for (int64_t c = std::min(candidates, n);; c = c * 8 >= n / 2 ? n : c * 8) {
    if (c < n) std::nth_element(sorted.begin(), sorted.begin() + (c - 1), sorted.end(), std::greater<double>());
    std::sort(sorted.begin(), sorted.begin() + c, std::greater<double>());
    double mass = 0, thr = 0;
    for (int64_t i = 0; i < c;) {
      const double level = sorted[size_t(i)];
      for (; i < c && sorted[size_t(i)] == level; ++i) mass += level / z;
      thr = level;
      if (mass >= double(top_p) - kTopPSlack) return thr;
    }
    if (c == n) return thr;  // within rounding of all the mass: every token stays
  }
}

namespace {

// The lowest index among the largest values (NaN was turned into -inf by the caller).
int64_t argmax(const std::vector<double>& l) {
  int64_t best = 0;
  for (int64_t c = 1; c < int64_t(l.size()); ++c)
    if (l[size_t(c)] > l[size_t(best)]) best = c;
  return best;
}

template <class T>
double raw_logsumexp(const T* x, int64_t V) {
  double mx = -INFINITY;
  for (int64_t c = 0; c < V; ++c) mx = std::max(mx, double(x[c]));
  if (!std::isfinite(mx)) return mx;
  double sum = 0;
  for (int64_t c = 0; c < V; ++c) sum += std::exp(double(x[c]) - mx);
  return mx + std::log(sum);
}

template <class T>
int32_t sample_row(const T* x, int64_t V, const SamplingParams& p, const int32_t* hist, int64_t n_hist) {
  std::vector<double> l(static_cast<size_t>(V));
  for (int64_t c = 0; c < V; ++c) {
    double v = double(x[c]);
    l[size_t(c)] = std::isnan(v) ? -INFINITY : v;
  }

  // Repetition penalty, once per distinct token however often it occurs.
  if (p.repetition_penalty != 1.f) {
    const double pen = p.repetition_penalty;
    std::vector<bool> seen(size_t(V), false);
    for (int64_t i = 0; i < n_hist; ++i) {
      const int32_t t = hist[i];
      ZP_CHECK(t >= 0 && t < V, "history token ", t, " out of range for vocabulary ", V);
      if (seen[size_t(t)]) continue;
      seen[size_t(t)] = true;
      double& v = l[size_t(t)];
      v = v < 0 ? v * pen : v / pen;
    }
  }

  const int64_t best = argmax(l);
  if (p.temperature == 0.f) return int32_t(best);

  for (double& v : l) v /= double(p.temperature);
  std::vector<bool> keep(size_t(V), true);

  // Top-k: everything >= the k-th largest, so ties with it are kept.
  if (p.top_k > 0 && p.top_k < V) {
    std::vector<double> sorted = l;
    std::nth_element(sorted.begin(), sorted.begin() + (p.top_k - 1), sorted.end(), std::greater<double>());
    const double thr = sorted[size_t(p.top_k - 1)];
    for (int64_t c = 0; c < V; ++c) keep[size_t(c)] = l[size_t(c)] >= thr;
  }

  // Unnormalised probabilities of the kept tokens. The max gets exactly 1, also when it is +-inf.
  const double mx = l[size_t(best)];
  std::vector<double> w(size_t(V), 0.0);
  double z = 0;
  for (int64_t c = 0; c < V; ++c) {
    if (!keep[size_t(c)]) continue;
    w[size_t(c)] = l[size_t(c)] == mx ? 1.0 : std::exp(l[size_t(c)] - mx);
    z += w[size_t(c)];
  }

  if (p.top_p < 1.f) {
    std::vector<double> kept_w;
    for (int64_t c = 0; c < V; ++c)
      if (keep[size_t(c)]) kept_w.push_back(w[size_t(c)]);
    const double thr = top_p_threshold(kept_w, z, p.top_p, kTopPCandidates);
    z = 0;
    for (int64_t c = 0; c < V; ++c) {
      if (keep[size_t(c)] && w[size_t(c)] < thr) keep[size_t(c)] = false;
      if (keep[size_t(c)]) z += w[size_t(c)];
    }
  }

  // Inverse CDF in vocabulary order.
  const double u = sampling_uniform(p.seed, p.draw);
  double run = 0;
  int64_t last = best;
  for (int64_t c = 0; c < V; ++c) {
    if (!keep[size_t(c)]) continue;
    run += w[size_t(c)] / z;
    if (run > u) return int32_t(c);
    last = c;
  }
  return int32_t(last);  // u within rounding of 1
}

}  // namespace

void sample_tokens(StreamHandle, DType dt, int32_t* tokens, float* logprobs, void* logits, int64_t S, int64_t V,
                   int64_t ld, const SamplingParams* params, const int32_t* history, const int64_t* history_starts) {
  ZP_CHECK(S >= 0 && V > 0 && ld >= V && V <= INT32_MAX, "sample_tokens: S ", S, ", V ", V, ", ld ", ld);
  for (int64_t r = 0; r < S; ++r) {
    check_sampling_params(params[r]);
    if (params[r].repetition_penalty != 1.f) {
      ZP_CHECK(history_starts, "row ", r, " has a repetition penalty but no history was given");
      ZP_CHECK(history_starts[r] >= 0 && history_starts[r] <= history_starts[r + 1],
               "history_starts must not decrease (row ", r, ")");
      ZP_CHECK(history || history_starts[r] == history_starts[r + 1], "row ", r,
               " has a repetition penalty but no history was given");
    }
  }
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    for (int64_t r = 0; r < S; ++r) {
      const T* x = static_cast<const T*>(logits) + r * ld;
      const SamplingParams& p = params[r];
      const bool pen = p.repetition_penalty != 1.f;
      const int32_t* h = pen ? history + history_starts[r] : nullptr;
      const int64_t n_hist = pen ? history_starts[r + 1] - history_starts[r] : 0;
      tokens[r] = sample_row(x, V, p, h, n_hist);
      if (logprobs) logprobs[r] = float(double(x[tokens[r]]) - raw_logsumexp(x, V));
    }
  });
}

}  // namespace cpu
}  // namespace zp::kernels
