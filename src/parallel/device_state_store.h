// Optimizer state in the blocks' device memory (the device tier): one fp32 tensor per range and
// kind, allocated where the block lives, updated in place by one fused multi-tensor kernel launch
// for all the ranges of a step.
#pragma once
#include "parallel/optimizer_state_store.h"

namespace zp::parallel {

class DeviceStateStore final : public OptimizerStateStore {
 public:
  DeviceStateStore(std::vector<OwnedRange> ranges, const InitialValues& initial, StreamHandle s);

  StateTier tier() const override { return StateTier::Device; }
  void update(std::span<const RangeUpdate> updates, const AdamWHyper& h, const kernels::AdamWConfig& cfg,
              StreamHandle s) override;
  void read(size_t i, OptimizerState which, int64_t offset, int64_t count, float* host, StreamHandle s) override;
  void write(size_t i, OptimizerState which, int64_t offset, int64_t count, const float* host,
             StreamHandle s) override;
  void write_weights(size_t i, void* weights_out, StreamHandle s) override;

 private:
  Tensor& state(size_t i, OptimizerState which);
  // Appends the update's parameters (its range split at parameter boundaries, gaps skipped) to `table`.
  void add_range(const RangeUpdate& u, const AdamWHyper& h, std::vector<kernels::AdamWTensor>& table);
  std::vector<Tensor> master_, m_, v_;
  std::vector<kernels::AdamWTensor> table_;  // reused: the kernel's argument list
};

}  // namespace zp::parallel
