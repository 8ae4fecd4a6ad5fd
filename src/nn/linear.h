// Linear layer y[N, out] = x[N, in] W^T + b with W stored [out, in]. The weight may be a packed group
// of parameters (q/k/v, gate/up) that together form one [sum(out_i), in] matrix: one GEMM for all.
//
// LoRA (issue 14): low-rank adapters may add into column ranges of the output, y[:, cols_i] +=
// scale * dropout(x) A_i^T B_i^T, without ever forming W + scale * B A: the adapters' A matrices are
// packed back to back, so u = dropout(x) [A_1; A_2; ...]^T is one thin GEMM, and each B_i GEMM
// accumulates into its columns of the base GEMM's output (beta = 1). Nothing is saved for the
// backward: u is recomputed there (2 N in r flops, r/out of the base GEMM's), and the dropout mask
// comes back from its counter hash (kernels/dropout.h). A frozen weight (Parameter::frozen, a LoRA
// run's base) gets no gradient; the adapters always do.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/row_linear.h"
#include "nn/context.h"
#include "nn/norm.h"
#include "nn/parameter.h"

namespace zp::nn {

class DeferredWeightGrads;

// One adapter of a Linear: A [r, in] and B [cols, r], adding into output columns [col, col + cols).
struct LowRankAdapter {
  Parameter* a = nullptr;
  Parameter* b = nullptr;
  int64_t col = 0;
};

class Linear {
 public:
  Linear() = default;
  // `weights` (and `biases`, empty for none) must be packed back to back in one block.
  Linear(std::vector<Parameter*> weights, std::vector<Parameter*> biases);
  Linear(Parameter* weight, Parameter* bias) : Linear(std::vector<Parameter*>{weight}, bias ? std::vector<Parameter*>{bias} : std::vector<Parameter*>{}) {}
  // A bias-free weight whose block holds zero rows after it up to `padded_rows` (ParamBlock::add_gap):
  // the GEMMs run over all padded rows, so their sizes stay aligned (a 50257-token vocabulary as 50304).
  static Linear padded(Parameter* weight, int64_t padded_rows);

  // Attaches LoRA adapters (their A matrices packed back to back in one block, in this order; column
  // ranges inside [0, out)), with y += scale * B A dropout(x). Dropout with probability `dropout` is
  // drawn only in forwards whose Ctx carries a dropout key (training).
  void set_adapters(std::vector<LowRankAdapter> adapters, float scale, float dropout);
  bool has_adapters() const { return !adapters_.empty(); }

  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  bool has_bias() const { return b_ != nullptr; }

  // y = x W^T + b (ldy: row stride of y, 0 = out), + residual [N, out] when given (added in the
  // GEMM's epilogue: no separate pass, one rounding).
  void forward(const Ctx& c, void* y, const void* x, int64_t N, int64_t ldy = 0, const void* residual = nullptr) const;
  // Inference, a decode step's few rows: y = norm(x) W^T + b (+ residual). On a GPU, with an RMSNorm
  // and no adapters, one kernel applies the norm to the product's input (kernels/row_linear.h);
  // otherwise the norm runs first and then forward(). Nothing is kept.
  void forward_normed(const Ctx& c, void* y, const void* x, const Norm& norm, int64_t N,
                      const void* residual = nullptr) const;
  // The same for a packed [gate | up] projection (2F outputs) with the SwiGLU applied to its product:
  // y[N, F] = silu(gate) * up, in one kernel, where that kernel takes the problem (as forward_normed's
  // fused case). Returns false, having done nothing, where it does not.
  bool forward_normed_swiglu(const Ctx& c, void* y, const void* x, const Norm& norm, int64_t N) const;
  // The same for a packed [q | k | v] projection ((Hq + 2 Hkv) D outputs) with RoPE applied to its q
  // and k heads and its k and v heads stored to the KV cache (kernels/row_linear.h's
  // RowOutput::RopeCache). Returns false, having done nothing, where the kernel does not take it.
  bool forward_normed_rope_cache(const Ctx& c, void* y, const void* x, const Norm& norm, int64_t N,
                                 const zp::kernels::RowRopeCache& rope) const;
  // y = gelu(pre), pre = x W^T + b, both from one GEMM (its epilogue applies the tanh GELU).
  void forward_gelu(const Ctx& c, void* y, void* pre, const void* x, int64_t N) const;
  // dW += dy^T x, db += colsum(dy); dx = dy W (or dx += when accumulate_dx); dx may be nullptr.
  // lddy: row stride of dy (0 = out).
  void backward(const Ctx& c, void* dx, const void* dy, const void* x, int64_t N, bool accumulate_dx = false,
                int64_t lddy = 0) const;
  // backward(), or with `later` (a split backward, nn/deferred_weight_grads.h) only dx now, the
  // parameter gradients left in `later`, which holds dy and x until then (no LoRA adapters).
  void backward(const Ctx& c, void* dx, const Tensor& dy, const Tensor& x, int64_t N, bool accumulate_dx,
                DeferredWeightGrads* later) const;
  // The two halves of backward(): parameter gradients, and the input gradient.
  void backward_params(const Ctx& c, const void* dy, const void* x, int64_t N, int64_t lddy = 0) const;
  void backward_input(const Ctx& c, void* dx, const void* dy, int64_t N, bool accumulate_dx = false,
                      int64_t lddy = 0) const;
  // The input half, for an input that was gelu(gelu_pre): dpre = (dy W) * gelu'(gelu_pre) straight
  // from the GEMM's epilogue, so no separate GELU backward pass (dy dense).
  void backward_input_gelu(const Ctx& c, void* dpre, const void* dy, const void* gelu_pre, int64_t N) const;

 private:
  // x itself, or dropout(x) in `keep` when this forward draws dropout.
  const void* adapter_input(const Ctx& c, const void* x, int64_t N, Tensor& keep) const;
  // u = adapter_input [A_1; A_2; ...]^T, [N, rank_].
  Tensor adapter_down(const Ctx& c, const void* xin, int64_t N) const;
  // du = scale * [dy_1 B_1 | dy_2 B_2 | ...], [N, rank_].
  Tensor adapter_dup(const Ctx& c, const void* dy, int64_t lddy, int64_t N) const;
  void adapters_forward(const Ctx& c, void* y, int64_t ldy, const void* x, int64_t N) const;
  // Whether row_linear takes this layer's product of N rows of x (leading dimension ldx).
  bool rows_fit(const Ctx& c, int64_t N, const void* x, int64_t ldx, const void* norm_weight) const;
  void adapters_backward_params(const Ctx& c, const void* dy, int64_t lddy, const void* x, int64_t N) const;
  void adapters_backward_input(const Ctx& c, void* dx, const void* dy, int64_t lddy, int64_t N) const;
  uint64_t dropout_key(const Ctx& c) const;

  Parameter* w_ = nullptr;  // first of the packed weights: its value/grad start the fused matrix
  Parameter* b_ = nullptr;
  int64_t in_ = 0, out_ = 0;
  std::vector<LowRankAdapter> adapters_;
  int64_t rank_ = 0;  // the adapters' ranks summed: u's width
  float scale_ = 1.f, dropout_ = 0.f;
  uint64_t adapter_id_ = 0;  // keys this Linear's dropout masks apart from every other's
};

}  // namespace zp::nn
