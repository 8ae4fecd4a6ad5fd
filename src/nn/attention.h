// Self-attention with grouped-query heads: one fused q/k/v projection whose output row is
// [q heads | k heads | v heads], RoPE on the q and k heads in place (Llama, Qwen2), the attention
// kernel reading q, k and v straight out of that packed row (strided, no transposes or copies), and
// the output projection. Causal for the language models; bidirectional for the UNet's image tokens
// (the attn1 of diffusers' BasicTransformerBlock, no RoPE, Hq = Hkv). Attention over another
// sequence (the UNet's text conditioning) is nn::CrossAttention.
#pragma once
#include "nn/context.h"
#include "nn/linear.h"
#include "nn/paged_kv_cache.h"

namespace zp::nn {

class DeferredWeightGrads;

// Several sequences packed into each row of T tokens (instruction fine-tuning): device int32 [B, T]
// arrays, on the device the activations live on. segments: a token attends only to tokens of its own
// segment id (kernels/attention.h). positions: RoPE positions, restarting at 0 in each segment
// (kernels/rope.h). Either may be nullptr: one sequence per row, positions 0..T-1.
struct TokenLayout {
  const int32_t* segments = nullptr;
  const int32_t* positions = nullptr;
};

struct AttentionShape {
  int64_t Hq = 1, Hkv = 1, D = 1;
  bool rope = false;
  float rope_theta = 10000.f;
  bool causal = true;  // false: every token sees every other (image tokens)
  int64_t qkv_width() const { return (Hq + 2 * Hkv) * D; }
};

class SelfAttention {
 public:
  struct Saved {
    Tensor qkv;  // [N, (Hq + 2 Hkv) D], after RoPE
    Tensor att;  // [N, Hq D], attention output before the projection
    Tensor lse;  // fp32 [B, Hq, T]
  };
  SelfAttention() = default;
  SelfAttention(Linear qkv, Linear out, AttentionShape shape) : qkv_(qkv), out_(out), sh_(shape) {}
  // y[N, C] = attention(x[N, C]) (+ residual[N, C], added by the output projection's GEMM) for
  // N = B * T tokens. `tokens` must be the same in the backward.
  void forward(const Ctx& c, void* y, const void* x, int64_t B, int64_t T, Saved& saved,
               const void* residual = nullptr, const TokenLayout& tokens = {}) const;
  // dx = (or += with accumulate_dx) the input gradient; parameter gradients accumulate, or with
  // `later` (a split backward, nn/deferred_weight_grads.h) are left in it, which then holds dy, x
  // and the saved attention output until its W (dy and x must not change before).
  void backward(const Ctx& c, void* dx, const Tensor& dy, const Tensor& x, int64_t B, int64_t T, const Saved& saved,
                bool accumulate_dx, const TokenLayout& tokens = {}, DeferredWeightGrads* later = nullptr) const;
  // Inference against a paged KV cache (nn/paged_kv_cache.h): y[N, C] = attention(x[N, C])
  // (+ residual) for the step's N new tokens, whose keys and values (after RoPE) are written into
  // layer `layer` of `cache` first. With `norm`, x is the layer's input and the attention's input is
  // norm(x) (applied inside the q/k/v product where it can: Linear::forward_normed). Keeps nothing;
  // causal models only.
  void forward_cached(const Ctx& c, void* y, const void* x, const CachedBatch& batch, const PagedKvCache& cache,
                      int64_t layer, const void* residual = nullptr, const Norm* norm = nullptr) const;

 private:
  Linear qkv_, out_;
  AttentionShape sh_;
};

}  // namespace zp::nn
