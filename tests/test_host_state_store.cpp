// The host tier of the optimizer state (parallel/host_state_store.h) against the device tier
// (parallel/device_state_store.h): the same updates give the same master weights, moments and new
// compute weights: bit for bit on the CPU (both run the CPU AdamW), to the rounding of the CUDA
// kernel's fused multiply-adds on a GPU, where the host store also walks its staging ring (ranges of
// several chunks through two slots) and pinned memory. Checkpoint reads and writes go to the state.
#include <gtest/gtest.h>

#include <memory>

#include "parallel/device_state_store.h"
#include "parallel/host_state_store.h"
#include "test_util.h"

namespace zp::test {
using namespace zp::parallel;

namespace {

// Two blocks, each with a decayed matrix, an undecayed vector and a gap between them; ranges as
// ZeRO-1 rank 1 of 2 would own them (the second half of each block, cutting the first parameter).
struct Blocks {
  std::vector<std::unique_ptr<nn::ParamBlock>> blocks;
  std::vector<OwnedRange> ranges;

  Blocks(Device dev, DType dt, int64_t rows, int64_t cols) {
    for (int k = 0; k < 2; ++k) {
      auto b = std::make_unique<nn::ParamBlock>("block" + std::to_string(k));
      b->add("w", {rows + k, cols}, true);
      b->add_gap(5);
      b->add("b", {cols + 3 * k}, false);
      b->allocate(dev, dt, nullptr, 2 * nn::ParamBlock::kAlign);
      const int64_t half = b->padded() / 2;
      Tensor init = upload(randn(size_t(b->padded()), 7 + k, 0.5f), dt, dev);
      copy_bytes(b->values().data(), dev, init.data(), dev, init.nbytes(), nullptr);
      ranges.push_back({b.get(), half, b->padded()});
      blocks.push_back(std::move(b));
    }
  }
  std::vector<const void*> initial() const {
    std::vector<const void*> v;
    for (const OwnedRange& r : ranges)
      v.push_back(static_cast<const char*>(r.block->values().data()) + size_t(r.begin) * dtype_size(r.block->dtype()));
    return v;
  }
};

std::vector<float> state_of(OptimizerStateStore& s, size_t i, OptimizerState which) {
  std::vector<float> h(size_t(s.ranges()[i].size()));
  s.read(i, which, 0, int64_t(h.size()), h.data(), nullptr);
  return h;
}

// Three steps of the same gradients through a device store and a host store of the same ranges;
// `tol` = 0 compares bit for bit.
void expect_host_matches_device(Device dev, DType dt, int64_t rows, int64_t cols, int buffer_count, double tol) {
  const std::string what = dev.str() + " " + std::string(dtype_name(dt));
  Blocks a(dev, dt, rows, cols), b(dev, dt, rows, cols);
  DeviceStateStore device(a.ranges, a.initial(), nullptr);
  HostStateStore host(b.ranges, b.initial(), nullptr, /*pinned=*/true, buffer_count);
  EXPECT_EQ(host.tier(), StateTier::PinnedHost);
  AdamWHyper h{1e-2, 0.9, 0.95, 1e-8, 0.1, false};
  std::vector<Tensor> grads, out_a, out_b;
  for (size_t i = 0; i < a.ranges.size(); ++i) {
    const int64_t n = a.ranges[i].size();
    grads.push_back(Tensor::empty({n}, DType::F32, dev));
    out_a.push_back(Tensor::zeros({n}, dt, dev));  // the gaps between parameters are never written
    out_b.push_back(Tensor::zeros({n}, dt, dev));
  }
  for (int step = 1; step <= 3; ++step) {
    std::vector<RangeUpdate> ua, ub;
    for (size_t i = 0; i < a.ranges.size(); ++i) {
      grads[i].copy_from(upload(randn(size_t(grads[i].numel()), 100 * step + i), DType::F32, dev));
      ua.push_back({i, grads[i].data<float>(), out_a[i].data()});
      ub.push_back({i, grads[i].data<float>(), out_b[i].data()});
    }
    kernels::AdamWConfig cfg{h.lr, h.beta1, h.beta2, h.eps, step, step == 2 ? 0.5f : 1.f};
    device.update(ua, h, cfg, nullptr);
    host.update(ub, h, cfg, nullptr);
  }
  if (dev.is_cuda()) device_synchronize();
  for (size_t i = 0; i < a.ranges.size(); ++i) {
    for (OptimizerState k : {OptimizerState::Master, OptimizerState::ExpAvg, OptimizerState::ExpAvgSq}) {
      const std::vector<float> want = state_of(device, i, k), got = state_of(host, i, k);
      if (tol == 0)
        EXPECT_EQ(got, want) << what << " range " << i << " state " << int(k);
      else
        EXPECT_LE(rel_error(got, want), tol) << what << " range " << i << " state " << int(k);
    }
    const std::vector<float> wa = download(out_a[i]), wb = download(out_b[i]);
    if (tol == 0)
      EXPECT_EQ(wb, wa) << what << " new weights of range " << i;
    else
      EXPECT_LE(rel_error(wb, wa), std::max(tol, double(tolerance(dt)))) << what << " new weights of range " << i;
  }

  // Checkpoint traffic: a write lands in the state, and write_weights casts the master weights out.
  std::vector<float> master = state_of(host, 1, OptimizerState::Master);
  for (float& x : master) x = -x;
  host.write(1, OptimizerState::Master, 0, int64_t(master.size()), master.data(), nullptr);
  EXPECT_EQ(state_of(host, 1, OptimizerState::Master), master) << what;
  host.write_weights(1, out_b[1].data(), nullptr);
  EXPECT_EQ(download(out_b[1]), round_to(master, dt)) << what;
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
