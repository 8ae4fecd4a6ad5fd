// AdamW over owned ranges of parameter blocks: each rank keeps fp32 master weights and fp32 moments
// only for its range [begin, end) of every block's flat buffer (the whole buffer when unsharded), in
// an OptimizerStateStore (the tier: device today), and an update writes the new weights, in the
// compute dtype, wherever the caller wants them (the block's full buffer or its ZeRO-3 shard). On
// the device store a step is one fused multi-tensor kernel launch over every range.
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "parallel/adamw_hyper.h"
#include "parallel/optimizer_state_store.h"

namespace zp::parallel {

class ShardedAdamW {
 public:
  ShardedAdamW(std::unique_ptr<OptimizerStateStore> store, const AdamWHyper& h, StreamHandle s = nullptr);
  // One update of the listed ranges (normally all of them). grad_scale multiplies gradients first;
  // the schedule's values (`sched`, those >= 0) override the configured ones.
  void step(std::span<const RangeUpdate> updates, float grad_scale = 1.f, const ScheduledHyper& sched = {});
  // The same update one range at a time (the optimizer stepping inside the backward): advance()
  // starts the step, then update() once for each range, on any stream.
  void advance() { ++step_; }
  void update(const RangeUpdate& u, float grad_scale, const ScheduledHyper& sched, StreamHandle s);
  // The same update run elsewhere (parallel/delayed_update.h, on a host thread): next_config()
  // starts the step on the calling thread and gives its settings, update_with() applies them.
  kernels::AdamWConfig next_config(float grad_scale, const ScheduledHyper& sched) {
    ++step_;
    return config(grad_scale, sched);
  }
  void update_with(std::span<const RangeUpdate> updates, const kernels::AdamWConfig& cfg, StreamHandle s) {
    store_->update(updates, h_, cfg, s);
  }
  int64_t steps() const { return step_; }
  void set_steps(int64_t n) { step_ = n; }
  const std::vector<OwnedRange>& ranges() const { return store_->ranges(); }
  OptimizerStateStore& state() { return *store_; }
  const OptimizerStateStore& state() const { return *store_; }
  AdamWHyper& hyper() { return h_; }

 private:
  kernels::AdamWConfig config(float grad_scale, const ScheduledHyper& sched) const;
  std::unique_ptr<OptimizerStateStore> store_;
  AdamWHyper h_;
  StreamHandle s_;
  int64_t step_ = 0;
};

}  // namespace zp::parallel
