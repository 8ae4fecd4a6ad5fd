// Linear layer y[N, out] = x[N, in] W^T + b with W stored [out, in]. The weight may be a packed group
// of parameters (q/k/v, gate/up) that together form one [sum(out_i), in] matrix: one GEMM for all.
#pragma once
#include <vector>

#include "nn/context.h"
#include "nn/parameter.h"

namespace zp::nn {

class Linear {
 public:
  Linear() = default;
  // `weights` (and `biases`, empty for none) must be packed back to back in one block.
  Linear(std::vector<Parameter*> weights, std::vector<Parameter*> biases);
  Linear(Parameter* weight, Parameter* bias) : Linear(std::vector<Parameter*>{weight}, bias ? std::vector<Parameter*>{bias} : std::vector<Parameter*>{}) {}
  // A bias-free weight whose block holds zero rows after it up to `padded_rows` (ParamBlock::add_gap):
  // the GEMMs run over all padded rows, so their sizes stay aligned (a 50257-token vocabulary as 50304).
  static Linear padded(Parameter* weight, int64_t padded_rows);

  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  bool has_bias() const { return b_ != nullptr; }

  // y = x W^T + b (ldy: row stride of y, 0 = out), + residual [N, out] when given (added in the
  // GEMM's epilogue: no separate pass, one rounding).
  void forward(const Ctx& c, void* y, const void* x, int64_t N, int64_t ldy = 0, const void* residual = nullptr) const;
  // y = gelu(pre), pre = x W^T + b, both from one GEMM (its epilogue applies the tanh GELU).
  void forward_gelu(const Ctx& c, void* y, void* pre, const void* x, int64_t N) const;
  // dW += dy^T x, db += colsum(dy); dx = dy W (or dx += when accumulate_dx); dx may be nullptr.
  // lddy: row stride of dy (0 = out).
  void backward(const Ctx& c, void* dx, const void* dy, const void* x, int64_t N, bool accumulate_dx = false,
                int64_t lddy = 0) const;
  // The two halves of backward(): parameter gradients, and the input gradient.
  void backward_params(const Ctx& c, const void* dy, const void* x, int64_t N, int64_t lddy = 0) const;
  void backward_input(const Ctx& c, void* dx, const void* dy, int64_t N, bool accumulate_dx = false,
                      int64_t lddy = 0) const;
  // The input half, for an input that was gelu(gelu_pre): dpre = (dy W) * gelu'(gelu_pre) straight
  // from the GEMM's epilogue, so no separate GELU backward pass (dy dense).
  void backward_input_gelu(const Ctx& c, void* dpre, const void* dy, const void* gelu_pre, int64_t N) const;

 private:
  Parameter* w_ = nullptr;  // first of the packed weights: its value/grad start the fused matrix
  Parameter* b_ = nullptr;
  int64_t in_ = 0, out_ = 0;
};

}  // namespace zp::nn
