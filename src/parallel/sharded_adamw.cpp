#include "parallel/sharded_adamw.h"

#include <algorithm>

#include "kernels/elementwise.h"

namespace zp::parallel {
using namespace zp::kernels;

ShardedAdamW::ShardedAdamW(std::vector<OwnedRange> ranges, const std::vector<const void*>& initial,
                           const AdamWHyper& h, StreamHandle s)
    : ranges_(std::move(ranges)), h_(h), s_(s) {
  ZP_CHECK(initial.size() == ranges_.size(), "ShardedAdamW: ", initial.size(), " initial values for ", ranges_.size(),
           " ranges");
  for (size_t i = 0; i < ranges_.size(); ++i) {
    const OwnedRange& r = ranges_[i];
    const Device dev = r.block->device();
    master_.push_back(Tensor::empty({r.size()}, DType::F32, dev, "master", s));
    m_.push_back(Tensor::zeros({r.size()}, DType::F32, dev, "optimizer", s));
    v_.push_back(Tensor::zeros({r.size()}, DType::F32, dev, "optimizer", s));
    ZP_KERNEL_CALL(dev, cast, s, DType::F32, master_[i].data(), r.block->dtype(), initial[i], r.size());
  }
}

void ShardedAdamW::add_range(size_t i, const float* grad, void* out, std::vector<AdamWTensor>& table) const {
  const OwnedRange& r = ranges_[i];
  const size_t esz = dtype_size(r.block->dtype());
  for (const auto& p : r.block->params()) {
    const int64_t lo = std::max(r.begin, p->offset), hi = std::min(r.end, p->offset + p->numel());
    if (lo >= hi) continue;
    const int64_t o = lo - r.begin;
    AdamWTensor t;
    t.param = master_[i].data<float>() + o;
    t.grad = grad + o;
    t.exp_avg = m_[i].data<float>() + o;
    t.exp_avg_sq = v_[i].data<float>() + o;
    t.param_copy = static_cast<char*>(out) + size_t(o) * esz;
    t.n = hi - lo;
    t.weight_decay = (p->decay || h_.decay_all) ? float(h_.weight_decay) : 0.f;
    table.push_back(t);
  }
}

void ShardedAdamW::launch(const std::vector<AdamWTensor>& table, float grad_scale, double lr, StreamHandle s) const {
  if (table.empty()) return;
  AdamWConfig cfg;
  cfg.lr = lr >= 0 ? lr : h_.lr;
  cfg.beta1 = h_.beta1;
  cfg.beta2 = h_.beta2;
  cfg.eps = h_.eps;
  cfg.step = step_;
  cfg.grad_scale = grad_scale;
  ZP_KERNEL_CALL(ranges_[0].block->device(), adamw_step, s, table.data(), int(table.size()), cfg,
                 ranges_[0].block->dtype());
}

void ShardedAdamW::step(const std::vector<const float*>& grads, const std::vector<void*>& out, float grad_scale,
                        double lr) {
  ZP_CHECK(grads.size() == ranges_.size() && out.size() == ranges_.size(), "ShardedAdamW::step: sizes");
  ++step_;
  tensors_.clear();
  for (size_t i = 0; i < ranges_.size(); ++i) add_range(i, grads[i], out[i], tensors_);
  launch(tensors_, grad_scale, lr, s_);
}

void ShardedAdamW::update(size_t i, const float* grad, void* out, float grad_scale, double lr, StreamHandle s) {
  ZP_CHECK(i < ranges_.size(), "ShardedAdamW::update: range ", i, " of ", ranges_.size());
  tensors_.clear();
  add_range(i, grad, out, tensors_);
  launch(tensors_, grad_scale, lr, s);
}

}  // namespace zp::parallel
