// The NVMe parameter tier's swap file and buffers (parallel/nvme_parameter_shards.h): shards of odd
// sizes written at start, then read back, rewritten and read again through 1 to 3 buffers, so every
// read comes from the file or from a buffer's cache as the buffers allow; a read after a rewrite sees
// the new values even while the write is still going to the file; buffer_size smaller than a shard
// is refused naming the key and the size; a missing directory names the option.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "parallel/nvme_parameter_shards.h"
#include "test_util.h"

namespace zp::test {
using namespace zp::parallel;

namespace {

NvmeSettings settings(const std::string& dir, int buffer_count, int64_t buffer_size = 0) {
  NvmeSettings s{dir, 8192, 4, buffer_count, buffer_size};
  s.path_key = "zero_optimization.offload_param.nvme_path";
  return s;
}

// Shard k's values: `version` marks which rewrite they are.
std::vector<float> values(size_t k, int64_t n, int version) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(k) * 1000.f + float(i) + float(version) * 0.5f;
  return v;
}

std::vector<float> read_back(NvmeParameterShards& shards, size_t k, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  std::memcpy(v.data(), shards.take(k), size_t(n) * sizeof(float));
  shards.release(k, nullptr);
  return v;
}

}  // namespace

TEST(NvmeParameterShards, ReadsSeeTheLatestWritesThroughAnyNumberOfBuffers) {
  ScratchFolder dir("nvme_params");
  const std::vector<int64_t> sizes = {5000, 17, 1024, 3333};  // elements: unaligned, tiny, aligned, odd
  for (int buffers : {1, 2, 3}) {
    bool pinned = true;
    NvmeParameterShards shards(settings(dir.str(), buffers), /*gpu=*/false, pinned);
    EXPECT_FALSE(pinned) << "pinning serves a GPU's copies only";
    for (size_t k = 0; k < sizes.size(); ++k) {
      const std::vector<float> v = values(k, sizes[k], 0);
      EXPECT_EQ(shards.add("block" + std::to_string(k), v.data(), Device::cpu(), sizes[k], DType::F32, nullptr), k);
    }
    EXPECT_EQ(shards.file_bytes(), NvmeParameterShards::file_bytes_for(std::vector<int64_t>{20000, 68, 4096, 13332}));
    EXPECT_EQ(shards.buffer_bytes(), NvmeParameterShards::buffer_bytes_for(20000, buffers));
    // In the learned order, with reads ahead, then backwards (the backward's order).
    for (size_t k = 0; k < sizes.size(); ++k) {
      if (k + 1 < sizes.size()) shards.read_ahead(k + 1);
      EXPECT_EQ(read_back(shards, k, sizes[k]), values(k, sizes[k], 0)) << buffers << " buffers, shard " << k;
    }
    // Rewritten in groups of the buffer count, as the update does; read at once (from a buffer,
    // possibly while its write is in flight) and after every buffer was reused (from the file).
    for (int version = 1; version <= 2; ++version) {
      for (size_t first = 0; first < sizes.size(); first += size_t(buffers)) {
        std::vector<size_t> group;
        for (size_t k = first; k < sizes.size() && k < first + size_t(buffers); ++k) {
          group.push_back(k);
          void* out = shards.begin_write(k);
          const std::vector<float> v = values(k, sizes[k], version);
          std::memcpy(out, v.data(), v.size() * sizeof(float));
        }
        shards.commit(group, nullptr);
      }
      const size_t last = sizes.size() - 1;
      EXPECT_EQ(read_back(shards, last, sizes[last]), values(last, sizes[last], version)) << buffers << " buffers";
      for (size_t k = sizes.size(); k-- > 0;)
        EXPECT_EQ(read_back(shards, k, sizes[k]), values(k, sizes[k], version))
            << buffers << " buffers, shard " << k << ", version " << version;
    }
    shards.flush();
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.str())) << "the swap files are unlinked";
}

TEST(NvmeParameterShards, ABufferSizeBelowAShardIsNamed) {
  ScratchFolder dir("nvme_params_size");
  bool pinned = false;
  NvmeParameterShards shards(settings(dir.str(), 2, 1000), false, pinned);
  const std::vector<float> v(1000, 1.f), w(1001, 1.f);
  shards.add("layers.0", v.data(), Device::cpu(), 1000, DType::F32, nullptr);
  expect_error([&] { shards.add("layers.1", w.data(), Device::cpu(), 1001, DType::F32, nullptr); },
               {"zero_optimization.offload_param.buffer_size = 1000 elements", "layers.1", "1001 elements",
                "raise it to at least 1001"});
}

TEST(NvmeParameterShards, AMissingDirectoryIsNamed) {
  bool pinned = false;
  expect_error([&] { NvmeParameterShards s(settings("/nonexistent/zeropipe-swap", 2), false, pinned); },
               {"zero_optimization.offload_param.nvme_path '/nonexistent/zeropipe-swap'", "does not exist"});
}

}  // namespace zp::test
