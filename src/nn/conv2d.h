// 2-d convolution module over channels-last images (NHWC), a weight Parameter [Cout, Cin, KH, KW] and
// an optional bias [Cout], with square stride and padding: the UNet's 3x3 convolutions (stride 1, or 2
// to downsample) and its 1x1 shortcut and projection convolutions. A 1x1 convolution with stride 1 is
// a GEMM of the pixels' rows [N*H*W, Cin] with the weight, and runs as one (cuDNN's 1x1 kernels ran
// at a fifth of cuBLASLt's rate on the UNet's shapes, H200).
//
// LoRA (issue 14), as PEFT's LoRA Conv2d: y += scale * B(A(dropout(x))), A a convolution with the
// base's kernel, stride and padding (Cin -> r), B a 1x1 convolution (r -> Cout), which is one GEMM
// adding into the base's output. As in nn::Linear, nothing is saved for the backward:
// u = A(dropout(x)) is recomputed there (r/Cout of the base's work), dropout masks come back from
// their counter hash, and a frozen base weight takes no gradient.
#pragma once
#include "kernels/conv2d.h"
#include "nn/context.h"
#include "nn/parameter.h"

namespace zp::nn {

class DeferredWeightGrads;

class Conv2d {
 public:
  Conv2d() = default;
  Conv2d(Parameter* weight, Parameter* bias, int64_t stride, int64_t pad);

  int64_t in() const { return w_->shape[1]; }
  int64_t out() const { return w_->shape[0]; }
  bool defined() const { return w_ != nullptr; }
  kernels::Conv2dShape shape(int64_t N, int64_t H, int64_t W) const;

  // Attaches a LoRA adapter: a [r, Cin, KH, KW] (this conv's kernel), b [Cout, r, 1, 1]. Dropout with
  // probability `dropout` is drawn only in forwards whose Ctx carries a dropout key (training), one
  // row of the mask per sample.
  void set_adapter(Parameter* a, Parameter* b, float scale, float dropout);
  bool has_adapter() const { return lora_a_ != nullptr; }

  // y[N, OH, OW, Cout] = conv(x[N, H, W, Cin]) + bias
  void forward(const Ctx& c, void* y, const void* x, int64_t N, int64_t H, int64_t W) const;
  // dweight and dbias accumulate (fp32); dx is written, or added with accumulate_dx; dx may be
  // nullptr (no input gradient).
  void backward(const Ctx& c, void* dx, const void* dy, const void* x, int64_t N, int64_t H, int64_t W,
                bool accumulate_dx = false) const;
  // backward(), or with `later` (a split backward, nn/deferred_weight_grads.h) only dx now, the
  // weight and bias gradients left in `later`, which holds dy and x until then (no LoRA adapter).
  void backward(const Ctx& c, void* dx, const Tensor& dy, const Tensor& x, int64_t N, int64_t H, int64_t W,
                bool accumulate_dx, DeferredWeightGrads* later) const;
  // The weight and bias gradients of backward() (none for a frozen weight; not the adapter's).
  void backward_params(const Ctx& c, const void* dy, const void* x, int64_t N, int64_t H, int64_t W) const;

 private:
  // x itself, or dropout(x) in `keep` when this forward draws dropout.
  const void* adapter_input(const Ctx& c, const void* x, int64_t N, int64_t H, int64_t W, Tensor& keep) const;
  // The adapter's A as a convolution: this one's shape with r output channels.
  kernels::Conv2dShape down_shape(int64_t N, int64_t H, int64_t W) const;
  void adapter_forward(const Ctx& c, void* y, const void* x, int64_t N, int64_t H, int64_t W) const;
  void adapter_backward(const Ctx& c, void* dx, const void* dy, const void* x, int64_t N, int64_t H, int64_t W) const;
  // Whether this convolution is a GEMM over pixels (1x1, stride 1, no padding).
  bool is_pointwise() const;
  // dx = (or += with accumulate_dx) the base convolution's input gradient.
  void backward_data(const Ctx& c, void* dx, const void* dy, int64_t N, int64_t H, int64_t W, bool accumulate_dx) const;

  Parameter* w_ = nullptr;
  Parameter* b_ = nullptr;
  int64_t stride_ = 1, pad_ = 0;
  Parameter* lora_a_ = nullptr;
  Parameter* lora_b_ = nullptr;
  float scale_ = 1.f, dropout_ = 0.f;
  uint64_t adapter_id_ = 0;  // keys this conv's dropout masks apart from every other module's
};

}  // namespace zp::nn
