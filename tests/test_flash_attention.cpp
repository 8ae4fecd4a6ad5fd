// The tensor-core flash path of the CUDA attention (kernels/cuda/flash_attention.cu) against the CPU
// reference, in bf16 and f16, on shapes and layouts the path accepts; plus a check that those calls do
// take it, and an opt-in throughput report (ZP_FLASH_ATTENTION_BENCH=1; prints, asserts nothing).
// The flash-path query exists only in CUDA builds; a CPU-only build has no such tests.
#ifdef ZP_WITH_CUDA
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/attention.h"
#include "packed_segments.h"
#include "test_util.h"

namespace zp::test {
namespace {
using namespace zp::kernels;

struct FlashCase {
  int64_t B, Tq, Tk, Hq, Hkv, D;
  bool causal;
  bool packed;  // q, k, v are views into one [B, T, (Hq + 2 Hkv) D] buffer (needs Tq == Tk)
};

std::string describe(const FlashCase& c, DType dt) {
  return "B=" + std::to_string(c.B) + " Tq=" + std::to_string(c.Tq) + " Tk=" + std::to_string(c.Tk) +
         " Hq=" + std::to_string(c.Hq) + " Hkv=" + std::to_string(c.Hkv) + " D=" + std::to_string(c.D) +
         (c.causal ? " causal" : "") + (c.packed ? " packed" : "") + " " + std::string(dtype_name(dt));
}

// Every input in one buffer: packed qkv, or three regions whose rows carry 8 elements of padding (a
// row stride the flash path still accepts, and padding that must stay untouched).
struct Layout {
  int64_t qs, ks, vs, os, q_off, k_off, v_off, in_size, out_size, lse_size;
};

Layout layout_for(const FlashCase& c) {
  Layout L{};
  if (c.packed) {
    L.qs = L.ks = L.vs = (c.Hq + 2 * c.Hkv) * c.D;
    L.q_off = 0;
    L.k_off = c.Hq * c.D;
    L.v_off = (c.Hq + c.Hkv) * c.D;
    L.in_size = c.B * c.Tq * L.qs;
    L.os = c.Hq * c.D;
  } else {
    L.qs = c.Hq * c.D + 8;
    L.ks = c.Hkv * c.D + 8;
    L.vs = c.Hkv * c.D + 16;
    L.os = c.Hq * c.D + 8;
    L.q_off = 0;
    L.k_off = c.B * c.Tq * L.qs;
    L.v_off = L.k_off + c.B * c.Tk * L.ks;
    L.in_size = L.v_off + c.B * c.Tk * L.vs;
  }
  L.out_size = c.B * c.Tq * L.os;
  L.lse_size = c.B * c.Hq * c.Tq;
  return L;
}

// The [rows, width] block at `off` with row stride `stride`.
std::vector<float> gather(const std::vector<float>& buf, int64_t off, int64_t stride, int64_t rows, int64_t width) {
  std::vector<float> r;
  r.reserve(size_t(rows * width));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t d = 0; d < width; ++d) r.push_back(buf[size_t(off + i * stride + d)]);
  return r;
}

// Entries of `buf` outside the rows' first `width` elements (the padding) are all zero.
bool padding_is_zero(const std::vector<float>& buf, int64_t off, int64_t stride, int64_t rows, int64_t width) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t d = width; d < stride; ++d)
      if (buf[size_t(off + i * stride + d)] != 0.f) return false;
  return true;
}

void expect_lse_close(const std::vector<float>& got, const std::vector<float>& want, double tol) {
  std::vector<float> g, w;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << "lse[" << i << "]";
    } else {
      g.push_back(got[i]);
      w.push_back(want[i]);
    }
  }
  EXPECT_LE(rel_error(g, w), tol) << "lse";
}

// With segment ids [B, T] when `seg` is not empty.
void check_against_cpu(const FlashCase& c, DType dt, const std::vector<int32_t>& seg = {}) {
  SCOPED_TRACE(describe(c, dt) + (seg.empty() ? "" : " segments"));
  Layout L = layout_for(c);
  ASSERT_TRUE(cuda::attention_uses_flash(dt, c.D, L.qs, L.ks, L.vs, L.os)) << "case would not take the flash path";
  uint64_t seed = uint64_t(c.Tq * 1000 + c.Tk * 7 + c.D + int(dt));
  // Rows carry padding that must stay zero; only the rows' payload is random.
  std::vector<float> in(size_t(L.in_size), 0.f);
  {
    auto r = round_to(randn(size_t(L.in_size), seed), dt);
    auto fill = [&](int64_t off, int64_t stride, int64_t rows, int64_t width) {
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t d = 0; d < width; ++d) in[size_t(off + i * stride + d)] = r[size_t(off + i * stride + d)];
    };
    fill(L.q_off, L.qs, c.B * c.Tq, c.Hq * c.D);
    fill(L.k_off, L.ks, c.B * c.Tk, c.Hkv * c.D);
    fill(L.v_off, L.vs, c.B * c.Tk, c.Hkv * c.D);
  }
  auto dout = round_to(randn(size_t(L.out_size), seed + 1), dt);
  const float scale = attention_default_scale(c.D);
  const int32_t* cpu_seg = seg.empty() ? nullptr : seg.data();
  Tensor g_seg;
  if (!seg.empty()) g_seg = upload(std::vector<float>(seg.begin(), seg.end()), DType::I32);
  const int32_t* gpu_seg = seg.empty() ? nullptr : g_seg.data<int32_t>();

  Tensor g_in = upload(in, dt), g_dout = upload(dout, dt);
  Tensor g_out = Tensor::zeros({L.out_size}, dt, Device::cuda());
  Tensor g_lse = Tensor::empty({std::max<int64_t>(L.lse_size, 1)}, DType::F32, Device::cuda());
  Tensor g_grad = Tensor::zeros({L.in_size}, dt, Device::cuda());
  auto at = [&](const Tensor& t, int64_t off) { return static_cast<char*>(t.data()) + off * dtype_size(dt); };
  cuda::attention_forward(nullptr, dt, g_out.data(), g_lse.data<float>(), at(g_in, L.q_off), at(g_in, L.k_off),
                          at(g_in, L.v_off), c.B, c.Tq, c.Tk, c.Hq, c.Hkv, c.D, L.qs, L.ks, L.vs, L.os, scale,
                          c.causal, gpu_seg);
  cuda::attention_backward(nullptr, dt, at(g_grad, L.q_off), at(g_grad, L.k_off), at(g_grad, L.v_off),
                           g_dout.data(), at(g_in, L.q_off), at(g_in, L.k_off), at(g_in, L.v_off), g_out.data(),
                           g_lse.data<float>(), c.B, c.Tq, c.Tk, c.Hq, c.Hkv, c.D, L.qs, L.ks, L.vs, L.os, scale,
                           c.causal, gpu_seg);

  std::vector<float> out(size_t(L.out_size), 0.f), lse(size_t(L.lse_size)), grad(size_t(L.in_size), 0.f);
  cpu::attention_forward(nullptr, DType::F32, out.data(), lse.data(), in.data() + L.q_off, in.data() + L.k_off,
                         in.data() + L.v_off, c.B, c.Tq, c.Tk, c.Hq, c.Hkv, c.D, L.qs, L.ks, L.vs, L.os, scale,
                         c.causal, cpu_seg);
  cpu::attention_backward(nullptr, DType::F32, grad.data() + L.q_off, grad.data() + L.k_off, grad.data() + L.v_off,
                          dout.data(), in.data() + L.q_off, in.data() + L.k_off, in.data() + L.v_off, out.data(),
                          lse.data(), c.B, c.Tq, c.Tk, c.Hq, c.Hkv, c.D, L.qs, L.ks, L.vs, L.os, scale, c.causal,
                          cpu_seg);

  const double tol = tolerance(dt);
  auto o = download(g_out);
  EXPECT_LE(rel_error(gather(o, 0, L.os, c.B * c.Tq, c.Hq * c.D), gather(out, 0, L.os, c.B * c.Tq, c.Hq * c.D)), tol)
      << "out";
  auto lse_gpu = download(g_lse);
  lse_gpu.resize(lse.size());
  expect_lse_close(lse_gpu, lse, 1e-5);
  auto g = download(g_grad);
  EXPECT_LE(rel_error(gather(g, L.q_off, L.qs, c.B * c.Tq, c.Hq * c.D),
                      gather(grad, L.q_off, L.qs, c.B * c.Tq, c.Hq * c.D)), tol) << "dq";
  EXPECT_LE(rel_error(gather(g, L.k_off, L.ks, c.B * c.Tk, c.Hkv * c.D),
                      gather(grad, L.k_off, L.ks, c.B * c.Tk, c.Hkv * c.D)), tol) << "dk";
  EXPECT_LE(rel_error(gather(g, L.v_off, L.vs, c.B * c.Tk, c.Hkv * c.D),
                      gather(grad, L.v_off, L.vs, c.B * c.Tk, c.Hkv * c.D)), tol) << "dv";
  if (!c.packed) {
    EXPECT_TRUE(padding_is_zero(g, L.q_off, L.qs, c.B * c.Tq, c.Hq * c.D)) << "dq row padding written";
    EXPECT_TRUE(padding_is_zero(g, L.k_off, L.ks, c.B * c.Tk, c.Hkv * c.D)) << "dk row padding written";
    EXPECT_TRUE(padding_is_zero(g, L.v_off, L.vs, c.B * c.Tk, c.Hkv * c.D)) << "dv row padding written";
    EXPECT_TRUE(padding_is_zero(o, 0, L.os, c.B * c.Tq, c.Hq * c.D)) << "out row padding written";
  }
}

const std::vector<FlashCase>& flash_cases() {
  static const std::vector<FlashCase> cases = {
      {2, 128, 128, 4, 4, 64, true, false},
      {2, 128, 128, 4, 4, 64, false, false},
      {1, 1000, 1000, 2, 2, 64, true, false},   // odd tail: partial query and key tiles
      {1, 257, 77, 8, 8, 64, false, false},     // cross-attention, Tq != Tk
      {1, 256, 256, 8, 2, 128, true, false},    // grouped-query heads
      {2, 200, 200, 6, 2, 64, true, true},      // GPT-style packed qkv with GQA
      {1, 1024, 1024, 2, 1, 128, true, false},
      {2, 77, 77, 4, 4, 80, false, false},      // SD UNet head dim
      {2, 257, 257, 4, 4, 40, false, false},    // SD 1.x head dim, computed 48 wide: zero columns 40..47
      {1, 300, 300, 4, 2, 40, true, false},     // the same, causal and grouped
      {1, 200, 77, 8, 8, 40, false, false},     // SD 1.x cross-attention
      {2, 200, 200, 6, 2, 40, true, true},      // packed: a head's writes must stop at column 40
      {2, 256, 256, 8, 8, 160, false, false},   // SD 1.x's 1280-channel blocks
      {1, 300, 77, 4, 4, 160, false, false},    // and their cross-attention
      {1, 200, 200, 4, 2, 160, true, true},
      {1, 300, 100, 2, 1, 64, true, false},     // Tq > Tk: the first 200 queries see no key
      {1, 100, 300, 2, 2, 128, true, false},    // Tq < Tk: bottom-right aligned mask
  };
  return cases;
}

}  // namespace

TEST(FlashAttentionGpu, TakesFlashPathOnlyWhereSupported) {
  ZP_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::BF16, DType::F16})
    for (int64_t D : {40, 64, 80, 128, 160}) {
      EXPECT_TRUE(cuda::attention_uses_flash(dt, D, 0, 0, 0, 0)) << dtype_name(dt) << " D=" << D;
      EXPECT_TRUE(cuda::attention_uses_flash(dt, D, 3 * 12 * D, 3 * 12 * D, 3 * 12 * D, 12 * D));  // packed qkv
    }
  EXPECT_FALSE(cuda::attention_uses_flash(DType::F32, 64, 0, 0, 0, 0));
  EXPECT_FALSE(cuda::attention_uses_flash(DType::BF16, 32, 0, 0, 0, 0));
  EXPECT_FALSE(cuda::attention_uses_flash(DType::BF16, 5, 0, 0, 0, 0));
  EXPECT_FALSE(cuda::attention_uses_flash(DType::BF16, 256, 0, 0, 0, 0));
  EXPECT_FALSE(cuda::attention_uses_flash(DType::F16, 64, 4 * 64 + 1, 0, 0, 0));  // stride not a multiple of 8
  EXPECT_FALSE(cuda::attention_uses_flash(DType::F16, 64, 0, 0, 0, 4 * 64 + 4));
}

TEST(FlashAttentionGpu, MatchesCpuBf16) {
  ZP_SKIP_WITHOUT_GPU();
  for (const FlashCase& c : flash_cases()) check_against_cpu(c, DType::BF16);
}

TEST(FlashAttentionGpu, MatchesCpuF16) {
  ZP_SKIP_WITHOUT_GPU();
  for (const FlashCase& c : flash_cases()) check_against_cpu(c, DType::F16);
}

// Packed sequences on the flash path, D = 64 and 128: runs of up to 300 tokens span several query and key
// tiles (so whole tiles are skipped, others masked elementwise or not at all); odd rows reuse ids out of
// order, which the tile skip must not mistake for disjoint ranges.
TEST(FlashAttentionGpu, MatchesCpuWithSegments) {
  ZP_SKIP_WITHOUT_GPU();
  const std::vector<FlashCase> cases = {
      {2, 1000, 1000, 4, 2, 64, true, true},     // GQA, packed qkv, causal
      {2, 1000, 1000, 4, 2, 64, false, true},    // bidirectional
      {2, 513, 513, 8, 2, 128, true, false},     // strided rows, partial tiles
      {2, 300, 300, 4, 4, 128, false, false},
      {2, 600, 600, 4, 4, 40, false, true},
      {2, 400, 400, 4, 2, 160, true, false},
  };
  for (DType dt : {DType::BF16, DType::F16})
    for (const FlashCase& c : cases)
      check_against_cpu(c, dt, packed_segment_ids(c.B, c.Tq, 300, uint64_t(c.Tq + c.D)));
  // One segment per row: the elementwise mask is skipped, results as without segments.
  const FlashCase one{2, 256, 256, 4, 4, 64, true, true};
  check_against_cpu(one, DType::BF16, std::vector<int32_t>(size_t(one.B * one.Tq), 3));
}

// Forward and backward TFLOP/s on training-sized shapes (FLOPs: 4 B H Tq Tk D forward, halved when
// causal; 2.5 times that backward). Opt-in: speed is never asserted.
TEST(FlashAttentionGpu, ReportsThroughput) {
  ZP_SKIP_WITHOUT_GPU();
  if (!std::getenv("ZP_FLASH_ATTENTION_BENCH")) GTEST_SKIP() << "set ZP_FLASH_ATTENTION_BENCH=1 to run";
  struct Shape { int64_t B, T, H, D; bool causal; };
  for (Shape sh : {Shape{32, 1024, 12, 64, true}, Shape{32, 1024, 12, 64, false}, Shape{16, 1024, 16, 128, true},
                   Shape{4, 4096, 16, 128, true}, Shape{8, 4096, 8, 80, false}, Shape{8, 4096, 8, 40, false},
                   Shape{8, 256, 8, 160, false}}) {
    const DType dt = DType::BF16;
    const int64_t n = sh.B * sh.T * sh.H * sh.D;
    Tensor x = upload(randn(size_t(n), 7), dt);
    Tensor out = Tensor::empty({n}, dt, Device::cuda()), dq = Tensor::empty({n}, dt, Device::cuda());
    Tensor dk = Tensor::empty({n}, dt, Device::cuda()), dv = Tensor::empty({n}, dt, Device::cuda());
    Tensor lse = Tensor::empty({sh.B * sh.H * sh.T}, DType::F32, Device::cuda());
    const float scale = attention_default_scale(sh.D);
    auto fwd = [&] {
      cuda::attention_forward(nullptr, dt, out.data(), lse.data<float>(), x.data(), x.data(), x.data(), sh.B, sh.T,
                              sh.T, sh.H, sh.H, sh.D, 0, 0, 0, 0, scale, sh.causal);
    };
    auto bwd = [&] {
      cuda::attention_backward(nullptr, dt, dq.data(), dk.data(), dv.data(), x.data(), x.data(), x.data(), x.data(),
                               out.data(), lse.data<float>(), sh.B, sh.T, sh.T, sh.H, sh.H, sh.D, 0, 0, 0, 0, scale,
                               sh.causal);
    };
    auto time_ms = [&](auto&& fn) {
      for (int i = 0; i < 2; ++i) fn();
      Event start, stop;
      const int iters = 10;
      start.record(nullptr);
      for (int i = 0; i < iters; ++i) fn();
      stop.record(nullptr);
      stop.synchronize();
      return double(stop.elapsed_ms_since(start)) / iters;
    };
    const double flops = 4.0 * sh.B * sh.H * sh.T * sh.T * sh.D / (sh.causal ? 2 : 1);
    double f_ms = time_ms(fwd), b_ms = time_ms(bwd);
    std::printf("flash attention bf16 B=%ld T=%ld H=%ld D=%ld%s: forward %.3f ms %.1f TFLOP/s, backward %.3f ms "
                "%.1f TFLOP/s\n",
                long(sh.B), long(sh.T), long(sh.H), long(sh.D), sh.causal ? " causal" : "", f_ms,
                flops / f_ms * 1e-9, b_ms, 2.5 * flops / b_ms * 1e-9);
  }
}

}  // namespace zp::test
#endif  // ZP_WITH_CUDA
