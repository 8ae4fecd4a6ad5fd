#include "runtime/adamw.h"

#include "kernels/elementwise.h"

namespace zp::runtime {
using namespace zp::kernels;

AdamW::AdamW(std::vector<nn::ParamBlock*> blocks, const AdamWHyper& h, StreamHandle s) : h_(h), s_(s) {
  for (nn::ParamBlock* b : blocks) {
    BlockState st{b, {}, {}, {}};
    const Tensor& values = b->values();
    Device dev = values.device();
    st.m = Tensor::zeros({values.numel()}, DType::F32, dev, "optimizer", s);
    st.v = Tensor::zeros({values.numel()}, DType::F32, dev, "optimizer", s);
    if (values.dtype() != DType::F32) {
      st.master = Tensor::empty({values.numel()}, DType::F32, dev, "master", s);
      ZP_KERNEL_CALL(dev, cast, s, DType::F32, st.master.data(), values.dtype(), values.data(), values.numel());
    }
    state_.push_back(std::move(st));
  }
}

void AdamW::step(float grad_scale, double lr) {
  ++step_;
  tensors_.clear();
  Device dev = Device::cpu();
  DType copy_dt = DType::F32;
  for (BlockState& st : state_) {
    const Tensor& values = st.block->values();
    dev = values.device();
    copy_dt = values.dtype();
    float* master = st.master.defined() ? st.master.data<float>() : values.data<float>();
    for (auto& p : st.block->params()) {
      AdamWTensor t;
      t.param = master + p->offset;
      t.grad = st.block->grads().data<float>() + p->offset;
      t.exp_avg = st.m.data<float>() + p->offset;
      t.exp_avg_sq = st.v.data<float>() + p->offset;
      t.param_copy = st.master.defined() ? static_cast<char*>(values.data()) + p->offset * int64_t(dtype_size(copy_dt))
                                         : nullptr;
      t.n = p->numel();
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

}  // namespace zp::runtime
