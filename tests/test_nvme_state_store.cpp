// The NVMe tier of the optimizer state (parallel/nvme_state_store.h) against the device tier: the
// same updates give the same master weights, moments and new weights, bit for bit on the CPU (both
// run the CPU AdamW), with ranges of odd sizes that span several chunks walked through 1 to 4 host
// buffers (every read-ahead and write-behind schedule); checkpoint reads and writes at unaligned
// offsets change exactly the elements asked for; a failed write fails the update naming the key.
#include <gtest/gtest.h>

#include <filesystem>

#include "parallel/nvme_state_store.h"
#include "state_store_test_util.h"

namespace zp::test {
using namespace zp::parallel;

namespace {

constexpr int64_t kSmallChunk = 1024;  // floats: the smallest aligned chunk, so a range spans several

NvmeSettings settings(const std::string& dir, int buffer_count, int64_t block_size = 8192, int queue_depth = 4) {
  return NvmeSettings{dir, block_size, queue_depth, buffer_count};
}

void expect_nvme_matches_device(Device dev, DType dt, int64_t rows, int64_t cols, const NvmeSettings& nvme,
                                int64_t chunk, double tol) {
  expect_store_matches_device(
      dev, dt, rows, cols,
      [&](const StoreBlocks& b) {
        auto store = std::make_unique<NvmeStateStore>(b.ranges, b.initial(), nullptr, nvme, /*pinned=*/true, 0, false,
                                                      chunk);
        EXPECT_EQ(store->tier(), StateTier::Nvme);
        return store;
      },
      tol, "NVMe store, " + std::to_string(nvme.buffer_count) + " buffers,");
}

}  // namespace

// Ranges of about 4900 and 5000 elements: five chunks each, the last one partial.
TEST(NvmeStateStore, MatchesTheDeviceStoreBitForBitCpu) {
  ScratchFolder dir("nvme_store");
  for (int buffers : {1, 2, 3, 4}) {
    expect_nvme_matches_device(Device::cpu(), DType::F32, 100, 97, settings(dir.str(), buffers), kSmallChunk, 0);
    expect_nvme_matches_device(Device::cpu(), DType::BF16, 100, 97, settings(dir.str(), buffers), kSmallChunk, 0);
  }
  // One chunk per range (the default chunk), and pieces of one page in a queue of one.
  expect_nvme_matches_device(Device::cpu(), DType::F32, 33, 17, settings(dir.str(), 4, 4096, 1),
                             NvmeStateStore::kChunk, 0);
  EXPECT_TRUE(std::filesystem::is_empty(dir.str())) << "the swap files are unlinked";
}

TEST(NvmeStateStore, ReadsAndWritesReachExactlyTheElementsAskedFor) {
  ScratchFolder dir("nvme_store_rw");
  StoreBlocks b(Device::cpu(), DType::F32, 100, 97);
  NvmeStateStore store(b.ranges, b.initial(), nullptr, settings(dir.str(), 2), false, 0, false, kSmallChunk);
  const int64_t n = b.ranges[1].size();
  // The master weights start at the compute values, the moments at zero.
  const std::vector<float> values = download(b.blocks[1]->values());
  EXPECT_EQ(state_of(store, 1, OptimizerState::Master),
            std::vector<float>(values.begin() + b.ranges[1].begin, values.end()));
  EXPECT_EQ(state_of(store, 1, OptimizerState::ExpAvgSq), std::vector<float>(size_t(n), 0.f));

  // Unaligned pieces, one inside a page, one across several chunks (larger than the three-chunk
  // buffer), one ending at the range's end.
  std::vector<float> want = randn(size_t(n), 3);
  store.write(1, OptimizerState::ExpAvg, 0, n, want.data(), nullptr);
  EXPECT_EQ(state_of(store, 1, OptimizerState::ExpAvg), want);
  const std::vector<std::pair<int64_t, int64_t>> pieces = {{5, 7}, {1000, 3500}, {n - 1500, 1500}};
  float x = 1.f;
  for (const auto& [off, count] : pieces) {
    std::vector<float> v(static_cast<size_t>(count));
    for (float& e : v) e = x++;
    // Another state through the buffer first: a write that kept the buffer's old contents around
    // the piece, instead of reading the page it changes part of, would show.
    state_of(store, 1, OptimizerState::Master);
    store.write(1, OptimizerState::ExpAvg, off, count, v.data(), nullptr);
    std::copy(v.begin(), v.end(), want.begin() + off);
  }
  EXPECT_EQ(state_of(store, 1, OptimizerState::ExpAvg), want);
  std::vector<float> part(3500);
  store.read(1, OptimizerState::ExpAvg, 1000, 3500, part.data(), nullptr);
  EXPECT_EQ(part, std::vector<float>(want.begin() + 1000, want.begin() + 4500));
  // The neighbours, in the same file, are untouched.
  EXPECT_EQ(state_of(store, 1, OptimizerState::ExpAvgSq), std::vector<float>(size_t(n), 0.f));
  EXPECT_EQ(state_of(store, 0, OptimizerState::ExpAvg), std::vector<float>(size_t(b.ranges[0].size()), 0.f));
  // state_bytes: three fp32 states per range, each padded to the page.
  size_t bytes = 0;
  for (const OwnedRange& r : b.ranges) bytes += 3 * size_t((r.size() * 4 + 4095) / 4096 * 4096);
  EXPECT_EQ(store.state_bytes(), bytes);
  EXPECT_EQ(store.buffer_bytes(), 2 * size_t(3 * kSmallChunk + 1024) * 4) << "two buffers, no staging on a CPU";
  // What the memory plan counts before any store exists.
  EXPECT_EQ(NvmeStateStore::file_bytes({b.ranges[0].size(), b.ranges[1].size()}), int64_t(bytes));
  EXPECT_EQ(NvmeStateStore::buffer_bytes_for(std::max(b.ranges[0].size(), b.ranges[1].size()), DType::F32, 2,
                                             /*gpu=*/false, kSmallChunk),
            store.buffer_bytes());
}

TEST(NvmeStateStore, BadPathFailsNamingTheKey) {
  StoreBlocks b(Device::cpu(), DType::F32, 10, 9);
  expect_error([&] { NvmeStateStore(b.ranges, b.initial(), nullptr, settings("/etc/hostname/x", 2), false); },
               {"zero_optimization.offload_optimizer.nvme_path '/etc/hostname/x'", "not a directory"});
}

// Ranges of 2.5 default chunks each walk the staging ring and the buffers several times on a GPU.
TEST(NvmeStateStoreGpu, MatchesTheDeviceStoreThroughTheBuffers) {
  ZP_SKIP_WITHOUT_GPU();
  ScratchFolder dir("nvme_store_gpu");
  const int64_t rows = 5 * NvmeStateStore::kChunk / 1024, cols = 1024;
  expect_nvme_matches_device(Device::cuda(0), DType::F32, rows, cols, settings(dir.str(), 3, 1 << 20, 8),
                             NvmeStateStore::kChunk, 1e-6);
  expect_nvme_matches_device(Device::cuda(0), DType::BF16, rows, cols, settings(dir.str(), 2, 1 << 20, 8),
                             NvmeStateStore::kChunk, 1e-6);
  expect_nvme_matches_device(Device::cuda(0), DType::BF16, 100, 97, settings(dir.str(), 4), kSmallChunk, 1e-6);
}

}  // namespace zp::test
