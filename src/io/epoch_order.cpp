#include "io/epoch_order.h"

#include <numeric>
#include <random>
#include <utility>

#include "core/error.h"

namespace zp::io {

void epoch_permutation(uint64_t seed, int64_t epoch, int64_t n, std::vector<int64_t>& order) {
  order.resize(size_t(n));
  std::iota(order.begin(), order.end(), 0);
  // Fisher-Yates with our own draws: std::shuffle's algorithm is not fixed by the standard.
  std::mt19937_64 g(seed * 0x9E3779B97F4A7C15ull + uint64_t(epoch));
  for (size_t k = order.size(); k > 1; --k) std::swap(order[k - 1], order[size_t(g() % k)]);
}

int64_t EpochOrder::at(uint64_t seed, int64_t epoch, int64_t n, int64_t i, bool shuffle) {
  ZP_CHECK(i >= 0 && i < n, "position ", i, " of ", n);
  if (!shuffle) return i;
  if (epoch_ != epoch || seed_ != seed || n_ != n) {
    epoch_permutation(seed, epoch, n, order_);
    epoch_ = epoch;
    seed_ = seed;
    n_ = n;
  }
  return order_[size_t(i)];
}

}  // namespace zp::io
