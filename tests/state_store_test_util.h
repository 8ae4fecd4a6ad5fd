// The optimizer-state stores that update on the CPU (host, NVMe) against the device store: the same
// updates give the same master weights, moments and new compute weights, and checkpoint reads and
// writes reach the state (tests/test_host_state_store.cpp, tests/test_nvme_state_store.cpp).
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <memory>

#include "parallel/device_state_store.h"
#include "test_util.h"

namespace zp::test {

// Two blocks, each with a decayed matrix, an undecayed vector and a gap between them; ranges as
// ZeRO-1 rank 1 of 2 would own them (the second half of each block, cutting the first parameter).
struct StoreBlocks {
  std::vector<std::unique_ptr<nn::ParamBlock>> blocks;
  std::vector<parallel::OwnedRange> ranges;

  StoreBlocks(Device dev, DType dt, int64_t rows, int64_t cols) {
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
  parallel::InitialValues initial() const {
    std::vector<const void*> v;
    for (const parallel::OwnedRange& r : ranges)
      v.push_back(static_cast<const char*>(r.block->values().data()) + size_t(r.begin) * dtype_size(r.block->dtype()));
    return parallel::initial_values_at(std::move(v));
  }
};

inline std::vector<float> state_of(parallel::OptimizerStateStore& s, size_t i, parallel::OptimizerState which) {
  std::vector<float> h(size_t(s.ranges()[i].size()));
  s.read(i, which, 0, int64_t(h.size()), h.data(), nullptr);
  return h;
}

using MakeStore = std::function<std::unique_ptr<parallel::OptimizerStateStore>(const StoreBlocks&)>;

// Three steps of the same gradients through a device store and the store `make` builds on the same
// ranges; `tol` = 0 compares bit for bit. Then checkpoint traffic: a write lands in the state, and
// write_weights casts the master weights out.
inline void expect_store_matches_device(Device dev, DType dt, int64_t rows, int64_t cols, const MakeStore& make,
                                        double tol, const std::string& what_store) {
  using namespace zp::parallel;
  const std::string what = what_store + " " + dev.str() + " " + std::string(dtype_name(dt));
  StoreBlocks a(dev, dt, rows, cols), b(dev, dt, rows, cols);
  DeviceStateStore device(a.ranges, a.initial(), nullptr);
  const std::unique_ptr<OptimizerStateStore> store = make(b);
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
    store->update(ub, h, cfg, nullptr);
  }
  if (dev.is_cuda()) device_synchronize();
  for (size_t i = 0; i < a.ranges.size(); ++i) {
    for (OptimizerState k : {OptimizerState::Master, OptimizerState::ExpAvg, OptimizerState::ExpAvgSq}) {
      const std::vector<float> want = state_of(device, i, k), got = state_of(*store, i, k);
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

  for (size_t i = 0; i < a.ranges.size(); ++i) {
    std::vector<float> master = state_of(*store, i, OptimizerState::Master);
    for (float& x : master) x = -x;
    store->write(i, OptimizerState::Master, 0, int64_t(master.size()), master.data(), nullptr);
    EXPECT_EQ(state_of(*store, i, OptimizerState::Master), master) << what << " range " << i;
    store->write_weights(i, out_b[i].data(), nullptr);
    if (dev.is_cuda()) device_synchronize();
    EXPECT_EQ(download(out_b[i]), round_to(master, dt)) << what << " range " << i;
  }
}

}  // namespace zp::test
