#include "nn/deferred_weight_grads.h"

#include "kernels/elementwise.h"

namespace zp::nn {
using namespace zp::kernels;

void DeferredWeightGrads::linear(const Linear& l, Tensor dy, Tensor x, int64_t N) {
  ZP_CHECK(!l.has_adapters(), "DeferredWeightGrads: a Linear with LoRA adapters computes its gradients in its backward");
  ZP_CHECK(dy.numel() == N * l.out() && x.numel() == N * l.in(), "DeferredWeightGrads: dy ", dy.str(), " and x ",
           x.str(), " for a [", l.out(), ", ", l.in(), "] Linear over ", N, " rows");
  linears_.push_back({&l, std::move(dy), std::move(x), N});
}

void DeferredWeightGrads::conv(const Conv2d& l, Tensor dy, Tensor x, int64_t N, int64_t H, int64_t W) {
  ZP_CHECK(!l.has_adapter(), "DeferredWeightGrads: a Conv2d with a LoRA adapter computes its gradients in its backward");
  const kernels::Conv2dShape s = l.shape(N, H, W);
  ZP_CHECK(dy.numel() == s.y_numel() && x.numel() == s.x_numel(), "DeferredWeightGrads: dy ", dy.str(), " and x ",
           x.str(), " for a ", l.in(), " -> ", l.out(), " Conv2d over ", N, " x ", H, "x", W);
  convs_.push_back({&l, std::move(dy), std::move(x), N, H, W});
}

float* DeferredWeightGrads::norm(Parameter* w, Parameter* b, int64_t width, const Ctx& c) {
  norms_.push_back({w, b, Tensor::zeros({b ? 2 * width : width}, DType::F32, c.dev, "activations", c.s)});
  return norms_.back().grads.data<float>();
}

void DeferredWeightGrads::run(const Ctx& c) {
  for (const LinearGrad& g : linears_) g.linear->backward_params(c, g.dy.data(), g.x.data(), g.N);
  for (const ConvGrad& g : convs_) g.conv->backward_params(c, g.dy.data(), g.x.data(), g.N, g.H, g.W);
  for (const NormGrad& g : norms_) {
    const int64_t width = g.w->shape[0];
    ZP_KERNEL_CALL(c.dev, axpy, c.s, DType::F32, g.w->g(), 1.f, g.grads.data<float>(), width);
    if (g.b) ZP_KERNEL_CALL(c.dev, axpy, c.s, DType::F32, g.b->g(), 1.f, g.grads.data<float>() + width, width);
  }
  // The held tensors go with the stream's work on them (the caching allocator orders reuse on it).
  linears_.clear();
  convs_.clear();
  norms_.clear();
}

}  // namespace zp::nn
