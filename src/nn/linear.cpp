#include "nn/linear.h"

#include "kernels/activation.h"
#include "kernels/dropout.h"
#include "kernels/gemm.h"
#include "kernels/row_linear.h"
#include "nn/deferred_weight_grads.h"
#include "nn/init.h"

namespace zp::nn {
using namespace zp::kernels;

static int64_t packed_rows(const std::vector<Parameter*>& ps, int64_t width, const char* what) {
  int64_t rows = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    const Parameter* p = ps[i];
    ZP_CHECK(p->shape.size() == (width ? 2u : 1u) && (!width || p->shape[1] == width), "Linear ", what, " ",
             p->name, " has shape ", shape_str(p->shape));
    if (i > 0) ZP_CHECK(p->offset == ps[i - 1]->offset + ps[i - 1]->numel(), "Linear ", what, " ", p->name,
                        " is not packed after ", ps[i - 1]->name);
    rows += p->shape[0];
  }
  return rows;
}

Linear::Linear(std::vector<Parameter*> weights, std::vector<Parameter*> biases) {
  ZP_CHECK(!weights.empty(), "Linear without weights");
  w_ = weights[0];
  in_ = w_->shape.at(1);
  out_ = packed_rows(weights, in_, "weight");
  if (!biases.empty()) {
    b_ = biases[0];
    ZP_CHECK(packed_rows(biases, 0, "bias") == out_, "Linear ", w_->name, ": biases do not match the outputs");
  }
}

void Linear::set_adapters(std::vector<LowRankAdapter> adapters, float scale, float dropout) {
  ZP_CHECK(dropout >= 0.f && dropout < 1.f, "Linear ", w_->name, ": LoRA dropout ", dropout, " is not in [0, 1)");
  rank_ = 0;
  for (size_t i = 0; i < adapters.size(); ++i) {
    const LowRankAdapter& ad = adapters[i];
    ZP_CHECK(ad.a && ad.b && ad.a->shape.size() == 2 && ad.b->shape.size() == 2 && ad.a->shape[1] == in_ &&
                 ad.b->shape[1] == ad.a->shape[0] && ad.col >= 0 && ad.col + ad.b->shape[0] <= out_,
             "Linear ", w_->name, ": adapter ", i, " does not fit an [", out_, ", ", in_, "] weight");
    if (i > 0)
      ZP_CHECK(ad.a->offset == adapters[i - 1].a->offset + adapters[i - 1].a->numel(), "Linear ", w_->name,
               ": adapter A ", ad.a->name, " is not packed after ", adapters[i - 1].a->name);
    rank_ += ad.a->shape[0];
  }
  adapters_ = std::move(adapters);
  scale_ = scale;
  dropout_ = dropout;
  // the first A's name: stable across runs and ranks
  adapter_id_ = fnv1a(adapters_.empty() ? std::string() : adapters_[0].a->name);
}

uint64_t Linear::dropout_key(const Ctx& c) const { return c.dropout.key ^ adapter_id_; }

const void* Linear::adapter_input(const Ctx& c, const void* x, int64_t N, Tensor& keep) const {
  if (dropout_ == 0.f || c.dropout.key == 0) return x;
  keep = c.act({N, in_});
  ZP_KERNEL_CALL(c.dev, dropout_apply, c.s, c.dt, keep.data(), in_, x, in_, N, in_, c.dropout.first_row(N),
                 dropout_key(c), dropout_, false);
  return keep.data();
}

Tensor Linear::adapter_down(const Ctx& c, const void* xin, int64_t N) const {
  Tensor u = c.act({N, rank_});
  ZP_KERNEL_CALL(c.dev, gemm, c.s, c.dt, c.dt, false, true, N, rank_, in_, 1.f, xin, in_, adapters_[0].a->v(), in_,
                 0.f, u.data(), rank_);
  return u;
}

Tensor Linear::adapter_dup(const Ctx& c, const void* dy, int64_t lddy, int64_t N) const {
  Tensor du = c.act({N, rank_});
  const size_t esz = dtype_size(c.dt);
  int64_t r0 = 0;
  for (const LowRankAdapter& ad : adapters_) {
    const int64_t r = ad.a->shape[0], cols = ad.b->shape[0];
    ZP_KERNEL_CALL(c.dev, gemm, c.s, c.dt, c.dt, false, false, N, r, cols, scale_,
                   static_cast<const char*>(dy) + size_t(ad.col) * esz, lddy, ad.b->v(), r, 0.f,
                   static_cast<char*>(du.data()) + size_t(r0) * esz, rank_);
    r0 += r;
  }
  return du;
}

void Linear::adapters_forward(const Ctx& c, void* y, int64_t ldy, const void* x, int64_t N) const {
  Tensor dropped;
  const Tensor u = adapter_down(c, adapter_input(c, x, N, dropped), N);
  const size_t esz = dtype_size(c.dt);
  int64_t r0 = 0;
  for (const LowRankAdapter& ad : adapters_) {
    const int64_t r = ad.a->shape[0], cols = ad.b->shape[0];
    // y[:, cols] += scale * u_i B_i^T, onto the base GEMM's output
    ZP_KERNEL_CALL(c.dev, gemm, c.s, c.dt, c.dt, false, true, N, cols, r, scale_,
                   static_cast<const char*>(u.data()) + size_t(r0) * esz, rank_, ad.b->v(), r, 1.f,
                   static_cast<char*>(y) + size_t(ad.col) * esz, ldy);
    r0 += r;
  }
}

void Linear::adapters_backward_params(const Ctx& c, const void* dy, int64_t lddy, const void* x, int64_t N) const {
  Tensor dropped;
  const void* xin = adapter_input(c, x, N, dropped);
  const size_t esz = dtype_size(c.dt);
  {
    const Tensor u = adapter_down(c, xin, N);
    int64_t r0 = 0;
    for (const LowRankAdapter& ad : adapters_) {
      const int64_t r = ad.a->shape[0], cols = ad.b->shape[0];
      // dB_i[cols, r] += scale * dy_i^T u_i
      ZP_KERNEL_CALL(c.dev, gemm, c.s, c.dt, DType::F32, true, false, cols, r, N, scale_,
                     static_cast<const char*>(dy) + size_t(ad.col) * esz, lddy,
                     static_cast<const char*>(u.data()) + size_t(r0) * esz, rank_, 1.f, ad.b->g(), r);
      r0 += r;
    }
  }
  // [dA_1; dA_2; ...][R, in] += du^T dropout(x): the packed A's are one matrix
  const Tensor du = adapter_dup(c, dy, lddy, N);
  ZP_KERNEL_CALL(c.dev, gemm, c.s, c.dt, DType::F32, true, false, rank_, in_, N, 1.f, du.data(), rank_, xin, in_, 1.f,
                 adapters_[0].a->g(), in_);
}

void Linear::adapters_backward_input(const Ctx& c, void* dx, const void* dy, int64_t lddy, int64_t N) const {
  const Tensor du = adapter_dup(c, dy, lddy, N);
  if (dropout_ == 0.f || c.dropout.key == 0) {
    ZP_KERNEL_CALL(c.dev, gemm, c.s, c.dt, c.dt, false, false, N, in_, rank_, 1.f, du.data(), rank_,
                   adapters_[0].a->v(), in_, 1.f, dx, in_);
    return;
  }
  // The gradient goes back through the forward's mask: dx += dropout(du A).
  Tensor dxin = c.act({N, in_});
  ZP_KERNEL_CALL(c.dev, gemm, c.s, c.dt, c.dt, false, false, N, in_, rank_, 1.f, du.data(), rank_,
                 adapters_[0].a->v(), in_, 0.f, dxin.data(), in_);
  ZP_KERNEL_CALL(c.dev, dropout_apply, c.s, c.dt, dx, in_, dxin.data(), in_, N, in_, c.dropout.first_row(N),
                 dropout_key(c), dropout_, true);
}

Linear Linear::padded(Parameter* weight, int64_t padded_rows) {
  Linear l(weight, nullptr);
  ZP_CHECK(padded_rows >= l.out_, "Linear ", weight->name, ": padded rows ", padded_rows, " < ", l.out_);
  l.out_ = padded_rows;
  return l;
}

void Linear::forward(const Ctx& c, void* y, const void* x, int64_t N, int64_t ldy, const void* residual) const {
  ZP_KERNEL_CALL(c.dev, gemm, c.s, c.dt, c.dt, false, true, N, out_, in_, 1.f, x, in_, w_->v(), in_,
                 residual ? 1.f : 0.f, y, ldy ? ldy : out_, b_ ? GemmEpilogue::Bias : GemmEpilogue::None,
                 b_ ? b_->v() : nullptr, nullptr, 1, 0, 0, 0, residual);
  if (!adapters_.empty()) adapters_forward(c, y, ldy ? ldy : out_, x, N);
}

bool Linear::rows_fit(const Ctx& c, int64_t N, const void* x, int64_t ldx, const void* norm_weight) const {
  return c.dev.is_cuda() && adapters_.empty() && row_linear_fits(c.dt, N, in_, ldx, x, in_, w_->v(), norm_weight);
}

void Linear::forward_normed(const Ctx& c, void* y, const void* x, const Norm& norm, int64_t N,
                            const void* residual) const {
  const void* nw = norm.rms_weight();
  if (nw && rows_fit(c, N, x, in_, nw)) {
    ZP_KERNEL_CALL(c.dev, row_linear, c.s, c.dt, RowInput::RmsNorm, RowOutput::Plain, N, out_, in_, x, in_, nw,
                   norm.eps(), w_->v(), in_, b_ ? b_->v() : nullptr, y, out_, residual);
    return;
  }
  Ctx working = c;
  working.saves = false;
  Tensor a = c.act({N, in_});
  Norm::Saved unused;
  norm.forward(working, a.data(), x, N, unused);
  forward(c, y, a.data(), N, 0, residual);
}

bool Linear::forward_normed_swiglu(const Ctx& c, void* y, const void* x, const Norm& norm, int64_t N) const {
  const void* nw = norm.rms_weight();
  if (!nw || out_ % 2 != 0 || !rows_fit(c, N, x, in_, nw)) return false;
  ZP_KERNEL_CALL(c.dev, row_linear, c.s, c.dt, RowInput::RmsNorm, RowOutput::SwiGLU, N, out_ / 2, in_, x, in_, nw,
                 norm.eps(), w_->v(), in_, b_ ? b_->v() : nullptr, y, out_ / 2, nullptr);
  return true;
}

bool Linear::forward_normed_rope_cache(const Ctx& c, void* y, const void* x, const Norm& norm, int64_t N,
                                       const RowRopeCache& rope) const {
  const void* nw = norm.rms_weight();
  if (!nw || !rows_fit(c, N, x, in_, nw)) return false;
  ZP_KERNEL_CALL(c.dev, row_linear, c.s, c.dt, RowInput::RmsNorm, RowOutput::RopeCache, N, out_, in_, x, in_, nw,
                 norm.eps(), w_->v(), in_, b_ ? b_->v() : nullptr, y, out_, nullptr, &rope);
  return true;
}

void Linear::forward_gelu(const Ctx& c, void* y, void* pre, const void* x, int64_t N) const {
  if (!adapters_.empty()) {  // the adapters add into pre, before the GELU
    forward(c, pre, x, N);
    ZP_KERNEL_CALL(c.dev, gelu_forward, c.s, c.dt, y, pre, N * out_, GeluKind::Tanh);
    return;
  }
  ZP_KERNEL_CALL(c.dev, gemm, c.s, c.dt, c.dt, false, true, N, out_, in_, 1.f, x, in_, w_->v(), in_, 0.f, y, out_,
                 b_ ? GemmEpilogue::BiasGelu : GemmEpilogue::Gelu, b_ ? b_->v() : nullptr, pre);
}

void Linear::backward_input_gelu(const Ctx& c, void* dpre, const void* dy, const void* gelu_pre, int64_t N) const {
  if (!adapters_.empty()) {  // d(gelu output) gets the adapters' part before the GELU's derivative
    Tensor dh = c.act({N, in_});
    backward_input(c, dh.data(), dy, N);
    ZP_KERNEL_CALL(c.dev, gelu_backward, c.s, c.dt, dpre, dh.data(), gelu_pre, N * in_, GeluKind::Tanh);
    return;
  }
  ZP_KERNEL_CALL(c.dev, gemm, c.s, c.dt, c.dt, false, false, N, in_, out_, 1.f, dy, out_, w_->v(), in_, 0.f, dpre, in_,
                 GemmEpilogue::DGelu, nullptr, const_cast<void*>(gelu_pre));
}

void Linear::backward(const Ctx& c, void* dx, const void* dy, const void* x, int64_t N, bool accumulate_dx,
                      int64_t lddy) const {
  backward_params(c, dy, x, N, lddy);
  if (dx) backward_input(c, dx, dy, N, accumulate_dx, lddy);
}

void Linear::backward(const Ctx& c, void* dx, const Tensor& dy, const Tensor& x, int64_t N, bool accumulate_dx,
                      DeferredWeightGrads* later) const {
  if (!later) return backward(c, dx, dy.data(), x.data(), N, accumulate_dx);
  later->linear(*this, dy, x, N);
  if (dx) backward_input(c, dx, dy.data(), N, accumulate_dx);
}

void Linear::backward_input(const Ctx& c, void* dx, const void* dy, int64_t N, bool accumulate_dx, int64_t lddy) const {
  ZP_KERNEL_CALL(c.dev, gemm, c.s, c.dt, c.dt, false, false, N, in_, out_, 1.f, dy, lddy ? lddy : out_, w_->v(), in_,
                 accumulate_dx ? 1.f : 0.f, dx, in_);
  if (!adapters_.empty()) adapters_backward_input(c, dx, dy, lddy ? lddy : out_, N);
}

void Linear::backward_params(const Ctx& c, const void* dy, const void* x, int64_t N, int64_t lddy) const {
  if (!lddy) lddy = out_;
  if (!adapters_.empty()) adapters_backward_params(c, dy, lddy, x, N);
  if (w_->frozen) return;
  // dW[out, in] += dy^T[out, N] x[N, in], accumulated in fp32
  ZP_KERNEL_CALL(c.dev, gemm, c.s, c.dt, DType::F32, true, false, out_, in_, N, 1.f, dy, lddy, x, in_, 1.f, w_->g(),
                 in_);
  if (b_) {
    ZP_CHECK(lddy == out_, "Linear ", w_->name, ": bias gradient needs a dense dy");
    ZP_KERNEL_CALL(c.dev, bias_grad, c.s, c.dt, b_->g(), dy, N, out_);
  }
}

}  // namespace zp::nn
