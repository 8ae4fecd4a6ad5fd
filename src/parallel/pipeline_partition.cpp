#include "parallel/pipeline_partition.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace zp::parallel {
namespace {

void require_enough_layers(int64_t layers, int chunks, const std::string& unit) {
  ZP_REQUIRE(chunks >= 1 && layers >= chunks, "pipeline.stages x pipeline.virtual_stages = ", chunks,
             " model chunks, but the model has ", layers, " ", unit, "s (each chunk needs at least one)");
}

}  // namespace

std::vector<int64_t> uniform_partition(int64_t layers, int chunks, const std::string& unit) {
  require_enough_layers(layers, chunks, unit);
  std::vector<int64_t> b{0};
  for (int k = 0; k < chunks; ++k) b.push_back(b.back() + layers / chunks + (k < layers % chunks ? 1 : 0));
  return b;
}

std::vector<int64_t> balanced_partition(const LayerCosts& costs, int chunks, const std::string& unit) {
  const int64_t L = int64_t(costs.layers.size());
  require_enough_layers(L, chunks, unit);
  std::vector<double> prefix(size_t(L) + 1, 0.0);
  for (int64_t i = 0; i < L; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + costs.layers[size_t(i)];
  auto cost = [&](int k, int64_t lo, int64_t hi) {
    return prefix[size_t(hi)] - prefix[size_t(lo)] + (k == 0 ? costs.first_extra : 0.0) +
           (k == chunks - 1 ? costs.last_extra : 0.0);
  };
  // best[k][i]: the least possible costliest chunk when chunks 0..k hold layers [0, i).
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(size_t(chunks), std::vector<double>(size_t(L) + 1, inf));
  std::vector<std::vector<int64_t>> cut(size_t(chunks), std::vector<int64_t>(size_t(L) + 1, 0));
  for (int64_t i = 1; i <= L; ++i) best[0][size_t(i)] = cost(0, 0, i);
  for (int k = 1; k < chunks; ++k)
    for (int64_t i = k + 1; i <= L; ++i)
      for (int64_t j = k; j < i; ++j) {
        const double v = std::max(best[size_t(k) - 1][size_t(j)], cost(k, j, i));
        if (v < best[size_t(k)][size_t(i)]) {
          best[size_t(k)][size_t(i)] = v;
          cut[size_t(k)][size_t(i)] = j;
        }
      }
  std::vector<int64_t> b(size_t(chunks) + 1, 0);
  b[size_t(chunks)] = L;
  for (int k = chunks - 1; k > 0; --k) b[size_t(k)] = cut[size_t(k)][size_t(b[size_t(k) + 1])];
  return b;
}

std::vector<int64_t> explicit_partition(const std::vector<int64_t>& firsts, int64_t layers, int chunks,
                                        const std::string& unit) {
  require_enough_layers(layers, chunks, unit);
  ZP_REQUIRE(int(firsts.size()) == chunks - 1, "pipeline.partition lists ", firsts.size(), " ", unit, " boundaries; ",
             chunks, " model chunks need ", chunks - 1);
  std::vector<int64_t> b{0};
  for (int64_t f : firsts) {
    ZP_REQUIRE(f > b.back() && f < layers, "pipeline.partition: ", unit, " ", f, " cannot start a chunk (the list "
               "must increase strictly, within (0, ", layers, ") for a model of ", layers, " ", unit, "s)");
    b.push_back(f);
  }
  b.push_back(layers);
  return b;
}

std::string partition_str(const std::vector<int64_t>& b, const std::string& unit) {
  std::string out = unit + "s";
  for (size_t k = 0; k + 1 < b.size(); ++k)
    out += (k ? " | [" : " [") + std::to_string(b[k]) + ", " + std::to_string(b[k + 1]) + ")";
  return out;
}

}  // namespace zp::parallel
