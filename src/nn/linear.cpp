#include "nn/linear.h"

#include "kernels/gemm.h"

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
}

void Linear::forward_gelu(const Ctx& c, void* y, void* pre, const void* x, int64_t N) const {
  ZP_KERNEL_CALL(c.dev, gemm, c.s, c.dt, c.dt, false, true, N, out_, in_, 1.f, x, in_, w_->v(), in_, 0.f, y, out_,
                 b_ ? GemmEpilogue::BiasGelu : GemmEpilogue::Gelu, b_ ? b_->v() : nullptr, pre);
}

void Linear::backward_input_gelu(const Ctx& c, void* dpre, const void* dy, const void* gelu_pre, int64_t N) const {
  ZP_KERNEL_CALL(c.dev, gemm, c.s, c.dt, c.dt, false, false, N, in_, out_, 1.f, dy, out_, w_->v(), in_, 0.f, dpre, in_,
                 GemmEpilogue::DGelu, nullptr, const_cast<void*>(gelu_pre));
}

void Linear::backward(const Ctx& c, void* dx, const void* dy, const void* x, int64_t N, bool accumulate_dx,
                      int64_t lddy) const {
  backward_params(c, dy, x, N, lddy);
  if (dx) backward_input(c, dx, dy, N, accumulate_dx, lddy);
}

void Linear::backward_input(const Ctx& c, void* dx, const void* dy, int64_t N, bool accumulate_dx, int64_t lddy) const {
  ZP_KERNEL_CALL(c.dev, gemm, c.s, c.dt, c.dt, false, false, N, in_, out_, 1.f, dy, lddy ? lddy : out_, w_->v(), in_,
                 accumulate_dx ? 1.f : 0.f, dx, in_);
}

void Linear::backward_params(const Ctx& c, const void* dy, const void* x, int64_t N, int64_t lddy) const {
  if (!lddy) lddy = out_;
  // dW[out, in] += dy^T[out, N] x[N, in], accumulated in fp32
  ZP_KERNEL_CALL(c.dev, gemm, c.s, c.dt, DType::F32, true, false, out_, in_, N, 1.f, dy, lddy, x, in_, 1.f, w_->g(),
                 in_);
  if (b_) {
    ZP_CHECK(lddy == out_, "Linear ", w_->name, ": bias gradient needs a dense dy");
    ZP_KERNEL_CALL(c.dev, bias_grad, c.s, c.dt, b_->g(), dy, N, out_);
  }
}

}  // namespace zp::nn
