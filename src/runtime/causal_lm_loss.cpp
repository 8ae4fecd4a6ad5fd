#include "runtime/causal_lm_loss.h"

#include "kernels/cross_entropy.h"

namespace zp::runtime {
using namespace zp::kernels;

CausalLmLoss::CausalLmLoss(const Tensor& logits, int64_t vocab, const int32_t* targets, double divisor,
                           StreamHandle s)
    : logits_data_(logits.data()), targets_(targets), divisor_(divisor), vocab_(vocab), s_(s) {
  ZP_CHECK(logits.dim() == 2 && vocab > 0 && logits.size(1) >= vocab, "logits ", logits.str(),
           " do not hold a vocabulary of ", vocab);
  N_ = logits.size(0);
  ld_ = logits.size(1);
  ZP_CHECK(divisor >= 0 && divisor <= double(N_), "a loss divisor of ", divisor, " for ", N_, " positions");
  const Device dev = logits.device();
  losses_ = Tensor::empty({N_}, DType::F32, dev, "activations", s);
  lse_ = Tensor::empty({N_}, DType::F32, dev, "activations", s);
  ZP_KERNEL_CALL(dev, cross_entropy_forward, s, logits.dtype(), losses_.data<float>(), lse_.data<float>(),
                 logits.data(), targets, N_, vocab, ld_);
}

double CausalLmLoss::mean() const {
  Tensor h = losses_.to(Device::cpu(), s_);
  double sum = 0;  // ignored rows hold 0
  for (int64_t i = 0; i < h.numel(); ++i) sum += h.data<float>()[i];
  return divisor_ > 0 ? sum / divisor_ : 0.0;
}

Tensor CausalLmLoss::backward(const Tensor& logits, float loss_scale) {
  ZP_CHECK(lse_.defined(), "a second backward of the same loss");
  ZP_CHECK(logits.defined() && logits.data() == logits_data_ && logits.dim() == 2 && logits.size(0) == N_ &&
               logits.size(1) == ld_,
           "backward needs the logits the loss was computed from");
  const float dscale = divisor_ > 0 ? loss_scale / float(divisor_) : 0.f;
  ZP_KERNEL_CALL(logits.device(), cross_entropy_backward, s_, logits.dtype(), logits.data(), logits.data(),
                 lse_.data<float>(), targets_, dscale, N_, vocab_, ld_);
  lse_ = Tensor();
  return logits;
}

}  // namespace zp::runtime
