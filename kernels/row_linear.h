// A few rows through a linear layer with the layer's input transform fused into the product: what a
// decode step does once per projection. y[M, N] = f(x)[M, K] W^T (+ bias) (+ residual), where f is
//   Plain    f(x) = x
//   RmsNorm  f(x)[m, k] = x[m, k] * rsqrt(mean_k x[m, :]^2 + eps) * norm_weight[k]
// (A SwiGLU input was tried and dropped: every block of the product recomputes f over all of K, and
// for the down projection, 2048 blocks of silu over 8192 gates, that cost more issue time on an H200
// than the separate pass it saved.) The output may instead be the SwiGLU of a packed gate/up product
// (RowOutput::SwiGLU): W is then [2N, K], gate rows then up rows as Llama's fused projection packs
// them, bias (if any) [2N], no residual, and y[m, n] = silu(g) * u with g, u the products of rows n and
// N + n; the kernel puts both rows of a pair in one block, so the activation costs no pass either.
// The output may also be a packed [q | k | v] projection row with RoPE and the KV cache write fused
// (RowOutput::RopeCache, with a RowRopeCache below): N = (Hq + 2 Hkv) D outputs, q and k heads rotated
// at the row's position (kernels/rope.h's rotation and angles), k and v heads also stored to the
// row's cache slot (kv_cache_write's layout, kernels/paged_attention.h); no residual. That is
// rope_kv_cache_write after a plain product, except that the rotation takes the fp32 sums before the
// one rounding; the kernel puts channels i and i + D/2 of a head in one block.
// W is [N, K] row-major with leading dimension ldw; x [M, K] has leading dimension ldx; y and
// residual (nullptr: none; it may be y itself) have leading dimension ldy; bias [N] may be nullptr.
// f(x) stays in fp32 (the unfused layers round it to dt first), the product accumulates in fp32, and
// bias, residual and SwiGLU are applied before the one rounding to dt (the unfused layers round the
// gate and up products first). Operands and result are dt, 16-bit on CUDA (F32 and F64 on the CPU
// too).
// row_linear_fits says whether the CUDA kernel takes a problem; callers fall back to the unfused
// layers otherwise.
#pragma once
#include <cstdint>

#include "kernels/kernel.h"

namespace zp::kernels {

enum class RowInput : uint8_t { Plain, RmsNorm };
enum class RowOutput : uint8_t { Plain, SwiGLU, RopeCache };

// RowOutput::RopeCache's heads, angles and cache. A row whose slot is negative stores nothing to the
// cache (as kv_cache_write).
struct RowRopeCache {
  int64_t Hq = 0, Hkv = 0, D = 0;
  float theta = 0.f;
  const int32_t* positions = nullptr;  // [M], on the device of the product
  const int32_t* slots = nullptr;      // [M]
  void* k_cache = nullptr;             // [slots, Hkv, D] in dt
  void* v_cache = nullptr;
};

inline constexpr int64_t kRowLinearMaxRows = 8;

// A caller's error (ZP_CHECK) unless `rope` describes a RoPE + cache output of N outputs, D <= 1024;
// nothing to check for other outputs.
void row_rope_cache_check(RowOutput out, int64_t N, const RowRopeCache* rope);

// The CUDA kernel's conditions: at most kRowLinearMaxRows rows, 16-bit operands, K and the leading
// dimensions of x and W multiples of 8 (16-byte packs), and x, W (and the norm weight) 16-byte aligned.
bool row_linear_fits(DType dt, int64_t M, int64_t K, int64_t ldx, const void* x, int64_t ldw, const void* w,
                     const void* norm_weight);

// Within its scope, on this thread, products of few rows (row_linear, and gemm's path for them) start
// reading their weights before the kernel ahead of them on the stream has finished (on GPUs with
// programmatic dependent launch), so a decode step's weight streams overlap the short kernels between
// them. Only where no kernel on the stream writes a product's weights: decoding with resident weights,
// not training (the optimizer's update) nor gathered or streamed weights. Scopes nest.
class ConstantWeightsScope {
 public:
  explicit ConstantWeightsScope(bool on = true);
  ~ConstantWeightsScope();
  ConstantWeightsScope(const ConstantWeightsScope&) = delete;
  ConstantWeightsScope& operator=(const ConstantWeightsScope&) = delete;
  static bool active();

 private:
  bool was_;
};

ZP_KERNEL(void row_linear(StreamHandle s, DType dt, RowInput in, RowOutput out, int64_t M, int64_t N, int64_t K,
                          const void* x, int64_t ldx, const void* norm_weight, float eps, const void* w, int64_t ldw,
                          const void* bias, void* y, int64_t ldy, const void* residual,
                          const RowRopeCache* rope = nullptr))

}  // namespace zp::kernels
