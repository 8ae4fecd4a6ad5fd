#include "parallel/sharded_adamw.h"

namespace zp::parallel {

ShardedAdamW::ShardedAdamW(std::unique_ptr<OptimizerStateStore> store, const AdamWHyper& h, StreamHandle s)
    : store_(std::move(store)), h_(h), s_(s) {}

kernels::AdamWConfig ShardedAdamW::config(float grad_scale, const ScheduledHyper& sched) const {
  kernels::AdamWConfig cfg;
  cfg.lr = sched.lr >= 0 ? sched.lr : h_.lr;
  cfg.beta1 = sched.beta1 >= 0 ? sched.beta1 : h_.beta1;
  cfg.beta2 = sched.beta2 >= 0 ? sched.beta2 : h_.beta2;
  cfg.eps = h_.eps;
  cfg.step = step_;
  cfg.grad_scale = grad_scale;
  return cfg;
}

void ShardedAdamW::step(std::span<const RangeUpdate> updates, float grad_scale, const ScheduledHyper& sched) {
  ++step_;
  store_->update(updates, h_, config(grad_scale, sched), s_);
}

void ShardedAdamW::update(const RangeUpdate& u, float grad_scale, const ScheduledHyper& sched, StreamHandle s) {
  ZP_CHECK(u.range < ranges().size(), "ShardedAdamW::update: range ", u.range, " of ", ranges().size());
  store_->update({&u, 1}, h_, config(grad_scale, sched), s);
}

}  // namespace zp::parallel
