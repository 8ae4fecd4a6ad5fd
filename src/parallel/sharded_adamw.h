// AdamW over owned ranges of parameter blocks: each rank keeps fp32 master weights and fp32 moments
// only for its range [begin, end) of every block's flat buffer (the whole buffer when unsharded),
// and one fused multi-tensor kernel launch updates them and writes the new weights, in the compute
// dtype, wherever the caller wants them (the block's full buffer or its ZeRO-3 shard). Ranges are
// split at parameter boundaries, because weight decay is per parameter; alignment gaps are skipped.
#pragma once
#include <vector>

#include "kernels/adamw.h"
#include "nn/parameter.h"

namespace zp::parallel {

struct AdamWHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool decay_all = false;  // weight decay on every parameter, not only those marked `decay`
  // The ZeRO engine updates each block as soon as its gradients are complete in the backward
  // (optimizer.step_in_backward): no step-long gradient buffers, but no clipping by the global norm.
  bool step_in_backward = false;
};

struct OwnedRange {
  nn::ParamBlock* block = nullptr;
  int64_t begin = 0, end = 0;  // elements of the block's padded flat buffer
  int64_t size() const { return end - begin; }
};

class ShardedAdamW {
 public:
  // `initial[i]` points at range i's current values (dt = the block's dtype, `size()` elements):
  // the fp32 master weights start from them.
  ShardedAdamW(std::vector<OwnedRange> ranges, const std::vector<const void*>& initial, const AdamWHyper& h,
               StreamHandle s = nullptr);
  // One update. grads[i]: fp32, range i's gradient (size() elements); out[i]: where range i's new
  // weights go, in the block's dtype. grad_scale multiplies gradients first; lr >= 0 overrides.
  void step(const std::vector<const float*>& grads, const std::vector<void*>& out, float grad_scale = 1.f,
            double lr = -1.0);
  // The same update one range at a time (the optimizer stepping inside the backward): advance()
  // starts the step, then update(i, ...) once for each range, on any stream.
  void advance() { ++step_; }
  void update(size_t i, const float* grad, void* out, float grad_scale, double lr, StreamHandle s);
  int64_t steps() const { return step_; }
  void set_steps(int64_t n) { step_ = n; }
  const std::vector<OwnedRange>& ranges() const { return ranges_; }
  // fp32 master weights and moments of range i (size() elements), for checkpoints.
  Tensor& master(size_t i) { return master_[i]; }
  Tensor& exp_avg(size_t i) { return m_[i]; }
  Tensor& exp_avg_sq(size_t i) { return v_[i]; }
  AdamWHyper& hyper() { return h_; }

 private:
  std::vector<OwnedRange> ranges_;
  std::vector<Tensor> master_, m_, v_;
  // Appends range i's parameters (split at parameter boundaries, gaps skipped) to `table`.
  void add_range(size_t i, const float* grad, void* out, std::vector<kernels::AdamWTensor>& table) const;
  void launch(const std::vector<kernels::AdamWTensor>& table, float grad_scale, double lr, StreamHandle s) const;
  std::vector<kernels::AdamWTensor> tensors_;
  AdamWHyper h_;
  StreamHandle s_;
  int64_t step_ = 0;
};

}  // namespace zp::parallel
