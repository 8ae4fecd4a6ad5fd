// The counter-based initialisation: a value depends only on (seed, name, index), so drawing a large
// range on several threads gives exactly what drawing each element alone gives.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "nn/init.h"

namespace zp::nn {
namespace {

TEST(CounterNormal, ThreadedRangeEqualsSingleDraws) {
  const int64_t n = 3 * (int64_t(1) << 18) + 5, begin = 12345;  // several pieces and a ragged end
  std::vector<float> all(static_cast<size_t>(n));
  counter_normal(7, "blocks.0.w", begin, n, 0.02, all.data());
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    float one = 0;
    counter_normal(7, "blocks.0.w", begin + i, 1, 0.02, &one);
    ASSERT_EQ(one, all[size_t(i)]) << "element " << i;
  }
  float last = 0;
  counter_normal(7, "blocks.0.w", begin + n - 1, 1, 0.02, &last);
  EXPECT_EQ(last, all.back());
  for (float v : all) {
    sum += v;
    sq += double(v) * v;
  }
  EXPECT_NEAR(sum / double(n), 0.0, 1e-4);
  EXPECT_NEAR(std::sqrt(sq / double(n)), 0.02, 2e-4);
  // Another name draws other values.
  float other = 0;
  counter_normal(7, "blocks.1.w", begin, 1, 0.02, &other);
  EXPECT_NE(other, all[0]);
}

}  // namespace
}  // namespace zp::nn
