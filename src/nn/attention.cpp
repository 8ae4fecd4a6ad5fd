#include "nn/attention.h"

#include "kernels/attention.h"
#include "kernels/paged_attention.h"
#include "kernels/rope.h"
#include "kernels/row_linear.h"
#include "nn/deferred_weight_grads.h"

namespace zp::nn {
using namespace zp::kernels;

void SelfAttention::forward(const Ctx& c, void* y, const void* x, int64_t B, int64_t T, Saved& saved,
                            const void* residual, const TokenLayout& tokens) const {
  const int64_t N = B * T, W = sh_.qkv_width(), Hq = sh_.Hq, Hkv = sh_.Hkv, D = sh_.D;
  saved.qkv = c.saved({N, W});
  saved.att = c.saved({N, Hq * D});
  saved.lse = c.saved({B, Hq, T}, DType::F32);
  qkv_.forward(c, saved.qkv.data(), x, N);
  char* base = static_cast<char*>(saved.qkv.data());
  const size_t esz = dtype_size(c.dt);
  // The q and k heads are adjacent in each row: one rotation covers both.
  if (sh_.rope)
    ZP_KERNEL_CALL(c.dev, rope_forward, c.s, c.dt, base, base, B, T, Hq + Hkv, D, sh_.rope_theta, 0, W,
                   tokens.positions);
  ZP_KERNEL_CALL(c.dev, attention_forward, c.s, c.dt, saved.att.data(), saved.lse.data<float>(), base,
                 base + size_t(Hq * D) * esz, base + size_t((Hq + Hkv) * D) * esz, B, T, T, Hq, Hkv, D, W, W, W,
                 Hq * D, attention_default_scale(D), sh_.causal, tokens.segments);
  out_.forward(c, y, saved.att.data(), N, 0, residual);
}

void SelfAttention::forward_cached(const Ctx& c, void* y, const void* x, const CachedBatch& b,
                                   const PagedKvCache& cache, int64_t layer, const void* residual,
                                   const Norm* norm) const {
  ZP_CHECK(sh_.causal, "forward_cached: a KV cache serves causal attention only");
  const int64_t N = b.num_tokens, Np = b.num_prefill_tokens, W = sh_.qkv_width(), Hq = sh_.Hq, Hkv = sh_.Hkv,
                D = sh_.D;
  Tensor qkv = c.act({N, W});
  char* base = static_cast<char*>(qkv.data());
  const size_t esz = dtype_size(c.dt), ko = size_t(Hq * D) * esz, vo = size_t((Hq + Hkv) * D) * esz;
  // A decode step's few rows on a GPU: norm, projection, rotation and cache write in one kernel.
  const RowRopeCache rope{Hq, Hkv, D, sh_.rope_theta, b.positions, b.slots, cache.k(layer), cache.v(layer)};
  if (!(sh_.rope && norm && qkv_.forward_normed_rope_cache(c, base, x, *norm, N, rope))) {
    if (norm)
      qkv_.forward_normed(c, base, x, *norm, N);
    else
      qkv_.forward(c, base, x, N);
    if (sh_.rope)
      ZP_KERNEL_CALL(c.dev, rope_kv_cache_write, c.s, c.dt, base, N, Hq, Hkv, D, W, sh_.rope_theta, b.positions,
                     cache.k(layer), cache.v(layer), b.slots, cache.block_size());
    else
      ZP_KERNEL_CALL(c.dev, kv_cache_write, c.s, c.dt, cache.k(layer), cache.v(layer), base + ko, base + vo, N, Hkv,
                     D, W, W, b.slots, cache.block_size());
  }
  Tensor att = c.act({N, Hq * D});
  const float scale = attention_default_scale(D);
  // Fresh prompts see only themselves: one packed row through the flash kernels, a segment per
  // sequence, straight from the projection (the cache holds the same values).
  if (Np > 0) {
    Tensor lse = c.act({1, Hq, Np}, DType::F32);
    ZP_KERNEL_CALL(c.dev, attention_forward, c.s, c.dt, att.data(), lse.data<float>(), base, base + ko, base + vo, 1,
                   Np, Np, Hq, Hkv, D, W, W, W, Hq * D, scale, true, b.segments);
  }
  if (N > Np) {
    char* att_dec = static_cast<char*>(att.data()) + size_t(Np * Hq * D) * esz;
    ZP_KERNEL_CALL(c.dev, paged_attention_forward, c.s, c.dt, att_dec, base + size_t(Np * W) * esz, cache.k(layer),
                   cache.v(layer), b.block_tables, b.max_blocks, b.context_lens, b.query_starts, b.num_decode_seqs,
                   N - Np, b.max_context_len, Hq, Hkv, D, cache.block_size(), W, Hq * D, scale);
  }
  out_.forward(c, y, att.data(), N, 0, residual);
}

void SelfAttention::backward(const Ctx& c, void* dx, const Tensor& dy, const Tensor& x, int64_t B, int64_t T,
                             const Saved& saved, bool accumulate_dx, const TokenLayout& tokens,
                             DeferredWeightGrads* later) const {
  const int64_t N = B * T, W = sh_.qkv_width(), Hq = sh_.Hq, Hkv = sh_.Hkv, D = sh_.D;
  Tensor datt = c.act({N, Hq * D});
  if (later) {
    out_.backward_input(c, datt.data(), dy.data(), N);
    later->linear(out_, dy, saved.att, N);
  } else {
    out_.backward(c, datt.data(), dy.data(), saved.att.data(), N);
  }
  Tensor dqkv = c.act({N, W});
  const char* base = static_cast<const char*>(saved.qkv.data());
  char* dbase = static_cast<char*>(dqkv.data());
  const size_t esz = dtype_size(c.dt), ko = size_t(Hq * D) * esz, vo = size_t((Hq + Hkv) * D) * esz;
  ZP_KERNEL_CALL(c.dev, attention_backward, c.s, c.dt, dbase, dbase + ko, dbase + vo, datt.data(), base, base + ko,
                 base + vo, saved.att.data(), saved.lse.data<float>(), B, T, T, Hq, Hkv, D, W, W, W, Hq * D,
                 attention_default_scale(D), sh_.causal, tokens.segments);
  if (sh_.rope)
    ZP_KERNEL_CALL(c.dev, rope_backward, c.s, c.dt, dbase, dbase, B, T, Hq + Hkv, D, sh_.rope_theta, 0, W,
                   tokens.positions);
  if (!later) {
    qkv_.backward(c, dx, dqkv.data(), x.data(), N, accumulate_dx);
    return;
  }
  if (dx) qkv_.backward_input(c, dx, dqkv.data(), N, accumulate_dx);
  later->linear(qkv_, std::move(dqkv), x, N);
}

}  // namespace zp::nn
