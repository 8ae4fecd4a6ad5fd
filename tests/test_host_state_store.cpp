// The host tier of the optimizer state (parallel/host_state_store.h) against the device tier
// (parallel/device_state_store.h): the same updates give the same master weights, moments and new
// compute weights: bit for bit on the CPU (both run the CPU AdamW), to the rounding of the CUDA
// kernel's fused multiply-adds on a GPU, where the host store also walks its staging ring (ranges of
// several chunks through two slots) and pinned memory. Checkpoint reads and writes go to the state.
#include <gtest/gtest.h>

#include <memory>

#include "parallel/host_state_store.h"
#include "state_store_test_util.h"

namespace zp::test {
using namespace zp::parallel;

namespace {

void expect_host_matches_device(Device dev, DType dt, int64_t rows, int64_t cols, int buffer_count, double tol) {
  expect_store_matches_device(
      dev, dt, rows, cols,
      [&](const StoreBlocks& b) {
        auto host = std::make_unique<HostStateStore>(b.ranges, b.initial(), nullptr, /*pinned=*/true, 0, buffer_count);
        EXPECT_EQ(host->tier(), StateTier::PinnedHost);
        return host;
      },
      tol, "host store");
}

}  // namespace

TEST(HostStateStore, MatchesTheDeviceStoreBitForBitCpu) {
  expect_host_matches_device(Device::cpu(), DType::F32, 33, 17, 4, 0);
  expect_host_matches_device(Device::cpu(), DType::BF16, 33, 17, 4, 0);
}

// Ranges of 2.5 staging chunks each walk the ring of two slots several times.
TEST(HostStateStoreGpu, MatchesTheDeviceStoreThroughTheStagingRing) {
  ZP_SKIP_WITHOUT_GPU();
  const int64_t rows = 5 * HostStateStore::kChunk / 1024, cols = 1024;
  expect_host_matches_device(Device::cuda(0), DType::F32, rows, cols, 2, 1e-6);
  expect_host_matches_device(Device::cuda(0), DType::BF16, rows, cols, 2, 1e-6);
  expect_host_matches_device(Device::cuda(0), DType::BF16, 33, 17, 4, 1e-6);
}

}  // namespace zp::test
