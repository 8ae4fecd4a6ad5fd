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

void ShardedAdamW::step(const std::vector<const float*>& grads, const std::vector<void*>& out, float grad_scale,
                        double lr) {
  ZP_CHECK(grads.size() == ranges_.size() && out.size() == ranges_.size(), "ShardedAdamW::step: sizes");
  ++step_;
  tensors_.clear();
  Device dev = Device::cpu();
  DType copy_dt = DType::F32;
  for (size_t i = 0; i < ranges_.size(); ++i) {
    const OwnedRange& r = ranges_[i];
    dev = r.block->device();
    copy_dt = r.block->dtype();
    const size_t esz = dtype_size(copy_dt);
    for (const auto& p : r.block->params()) {
      const int64_t lo = std::max(r.begin, p->offset), hi = std::min(r.end, p->offset + p->numel());
      if (lo >= hi) continue;
      const int64_t o = lo - r.begin;
      AdamWTensor t;
      t.param = master_[i].data<float>() + o;
      t.grad = grads[i] + o;
      t.exp_avg = m_[i].data<float>() + o;
      t.exp_avg_sq = v_[i].data<float>() + o;
      t.param_copy = static_cast<char*>(out[i]) + size_t(o) * esz;
      t.n = hi - lo;
      t.weight_decay = (p->decay || h_.decay_all) ? float(h_.weight_decay) : 0.f;
      tensors_.push_back(t);
    }
  }
  if (tensors_.empty()) return;
  AdamWConfig cfg;
  cfg.lr = lr >= 0 ? lr : h_.lr;
  cfg.beta1 = h_.beta1;
  cfg.beta2 = h_.beta2;
  cfg.eps = h_.eps;
  cfg.step = step_;
  cfg.grad_scale = grad_scale;
  ZP_KERNEL_CALL(dev, adamw_step, s_, tensors_.data(), int(tensors_.size()), cfg, copy_dt);
}

}  // namespace zp::parallel
