// Packed-sequence test inputs: segment ids for rows that hold several sequences, and the tokens of each
// segment, so a packed result can be compared with each sequence run on its own.
#pragma once
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace zp::test {

// Segment ids [B, T]: runs of 1..max_len tokens. Even rows number their runs 0, 1, 2, ... (sorted, as
// packing makes them); odd rows draw each run's id from {-1, 0, 1, 2}, so an id recurs after other ids
// and -1 (padding) is a segment like any other.
inline std::vector<int32_t> packed_segment_ids(int64_t B, int64_t T, int64_t max_len, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> ids;
  for (int64_t b = 0; b < B; ++b) {
    int32_t next = 0;
    for (int64_t t = 0; t < T;) {
      const int64_t len = std::min<int64_t>(1 + int64_t(g() % uint64_t(max_len)), T - t);
      const int32_t id = b % 2 == 0 ? next++ : int32_t(g() % 4) - 1;
      for (int64_t i = 0; i < len; ++i) ids.push_back(id);
      t += len;
    }
  }
  return ids;
}

// The token indices of each segment of row b, in order; segments in order of first appearance.
inline std::vector<std::vector<int64_t>> segment_tokens(const std::vector<int32_t>& ids, int64_t b, int64_t T) {
  std::vector<int32_t> order;
  std::vector<std::vector<int64_t>> tokens;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t id = ids[size_t(b * T + t)];
    size_t k = 0;
    while (k < order.size() && order[k] != id) ++k;
    if (k == order.size()) {
      order.push_back(id);
      tokens.emplace_back();
    }
    tokens[k].push_back(t);
  }
  return tokens;
}

}  // namespace zp::test
