// The order in which an epoch visits a dataset's items (token windows, instruction rows): a seeded
// permutation that depends only on (seed, epoch, item count), never on the world size, so every rank
// computes the same order and takes its share of a global batch by position.
#pragma once
#include <cstdint>
#include <vector>

namespace zp::io {

// Fills `order` with the permutation of [0, n) that epoch `epoch` visits under `seed`.
void epoch_permutation(uint64_t seed, int64_t epoch, int64_t n, std::vector<int64_t>& order);

// epoch_permutation for one epoch at a time, kept between calls: consecutive positions of one epoch
// cost one lookup each.
class EpochOrder {
 public:
  // The item at position `i` (0 <= i < n) of epoch `epoch`'s order; shuffle=false: the identity.
  int64_t at(uint64_t seed, int64_t epoch, int64_t n, int64_t i, bool shuffle);

 private:
  int64_t epoch_ = -1, n_ = -1;
  uint64_t seed_ = 0;
  std::vector<int64_t> order_;
};

}  // namespace zp::io
