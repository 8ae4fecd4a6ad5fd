// The optimizer state split between the device and an offloaded tier (parallel/split_state_store.h,
// zero_optimization.offload_optimizer.ratio): the store make_optimizer_state_store builds for a ratio
// below 1 keeps the leading range on the device and the other on the offloaded tier, and behaves as
// one store: the same updates give the device store's state and weights (bit for bit on the CPU,
// where both parts run the CPU AdamW; to the CUDA kernel's rounding on a GPU), and checkpoint reads
// and writes reach each range wherever it lives.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>

#include "parallel/split_state_store.h"
#include "state_store_test_util.h"

namespace zp::test {
using namespace zp::parallel;

namespace {

void expect_split_matches_device(Device dev, DType dt, const std::string& tier, double tol) {
  ShardingPolicy policy = ShardingPolicy::from_config(1, tier, "none");
  policy.set_offload_ratio(0.5);
  if (tier == "nvme") policy.set_optimizer_nvme({std::filesystem::temp_directory_path().string()});
  expect_store_matches_device(
      dev, dt, 33, 17,
      [&](const StoreBlocks& b) {
        std::unique_ptr<OptimizerStateStore> store = make_optimizer_state_store(policy, b.ranges, b.initial(), nullptr);
        const auto* split = dynamic_cast<const SplitStateStore*>(store.get());
        EXPECT_NE(split, nullptr) << "ratio 0.5 over two ranges splits them";
        if (split) {
          EXPECT_EQ(split->device_part().tier(), StateTier::Device);
          EXPECT_EQ(split->offloaded_part().tier(), policy.optimizer_tier());
          EXPECT_EQ(split->device_part().ranges().size(), 1u);
          EXPECT_EQ(split->device_part().ranges()[0].block, b.ranges[0].block) << "the leading range stays";
          EXPECT_EQ(split->offloaded_part().ranges().size(), 1u);
        }
        return store;
      },
      tol, "split store (" + tier + ")");
}

}  // namespace

TEST(SplitStateStore, MatchesTheDeviceStoreBitForBitCpu) {
  expect_split_matches_device(Device::cpu(), DType::F32, "cpu", 0);
  expect_split_matches_device(Device::cpu(), DType::BF16, "cpu", 0);
  expect_split_matches_device(Device::cpu(), DType::BF16, "nvme", 0);
}

TEST(SplitStateStoreGpu, MatchesTheDeviceStoreOnAGpu) {
  ZP_SKIP_WITHOUT_GPU();
  expect_split_matches_device(Device::cuda(0), DType::BF16, "cpu", 1e-6);
  expect_split_matches_device(Device::cuda(0), DType::F32, "nvme", 1e-6);
}

}  // namespace zp::test
