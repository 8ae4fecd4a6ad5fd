#include "kernels/embedding.h"

#include <algorithm>
#include <numeric>
#include <vector>

namespace zp::kernels::cpu {
namespace {

void check_sizes(const int32_t* ids, int64_t N, int64_t C, int64_t V, bool positions, int64_t T,
                 int64_t pos_offset) {
  ZP_CHECK(N >= 0 && C >= 0 && V > 0, "N=", N, " C=", C, " V=", V);
  if (positions) ZP_CHECK(T > 0 && pos_offset >= 0, "T=", T, " pos_offset=", pos_offset);
  for (int64_t r = 0; r < N; ++r)
    ZP_CHECK(ids[r] >= 0 && ids[r] < V, "token id ", ids[r], " at row ", r, " is outside [0, ", V, ")");
}

}  // namespace

void embedding_forward(StreamHandle, DType dt, void* y, const int32_t* ids, const void* table, int64_t N,
                       int64_t C, int64_t V, const void* pos_table, int64_t T, int64_t pos_offset,
                       const int32_t* positions) {
  check_sizes(ids, N, C, V, pos_table != nullptr, T, pos_offset);
  if (positions)
    for (int64_t r = 0; r < N; ++r) ZP_CHECK(positions[r] >= 0, "position ", positions[r], " at row ", r);
  ZP_DISPATCH_FLOAT(dt, E, [&] {
    for (int64_t r = 0; r < N; ++r) {
      const E* tok = static_cast<const E*>(table) + ids[r] * C;
      const E* pos = !pos_table ? nullptr
                     : static_cast<const E*>(pos_table) + (positions ? positions[r] : pos_offset + r % T) * C;
      E* out = static_cast<E*>(y) + r * C;
      for (int64_t c = 0; c < C; ++c) out[c] = E(double(tok[c]) + (pos ? double(pos[c]) : 0.0));
    }
  });
}

void embedding_backward(StreamHandle, DType dt, float* dtable, float* dpos_table, const void* dy,
                        const int32_t* ids, int64_t N, int64_t C, int64_t V, int64_t T, int64_t pos_offset,
                        const int32_t* positions) {
  check_sizes(ids, N, C, V, dpos_table != nullptr, T, pos_offset);
  ZP_DISPATCH_FLOAT(dt, E, [&] {
    // Visit the rows grouped by token, so each table row's gradient is summed in double and added
    // to dtable once (memory O(N), not O(V * C)).
    std::vector<int64_t> order(static_cast<size_t>(N));
    std::iota(order.begin(), order.end(), int64_t(0));
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
    std::vector<double> acc(static_cast<size_t>(C));
    for (size_t i = 0; i < order.size();) {
      const int32_t id = ids[order[i]];
      std::fill(acc.begin(), acc.end(), 0.0);
      for (; i < order.size() && ids[order[i]] == id; ++i) {
        const E* g = static_cast<const E*>(dy) + order[i] * C;
        for (int64_t c = 0; c < C; ++c) acc[size_t(c)] += double(g[c]);
      }
      float* d = dtable + int64_t(id) * C;
      for (int64_t c = 0; c < C; ++c) d[c] = float(double(d[c]) + acc[size_t(c)]);
    }
    if (!dpos_table) return;
    if (positions) {  // rows in order: each position's sum is deterministic
      for (int64_t r = 0; r < N; ++r) {
        float* dp = dpos_table + int64_t(positions[r]) * C;
        for (int64_t c = 0; c < C; ++c) dp[c] = float(double(dp[c]) + double(static_cast<const E*>(dy)[r * C + c]));
      }
      return;
    }
    for (int64_t t = 0; t < T && t < N; ++t) {
      float* dp = dpos_table + (pos_offset + t) * C;
      for (int64_t c = 0; c < C; ++c) {
        double sum = 0;
        for (int64_t r = t; r < N; r += T) sum += double(static_cast<const E*>(dy)[r * C + c]);
        dp[c] = float(double(dp[c]) + sum);
      }
    }
  });
}

}  // namespace zp::kernels::cpu
