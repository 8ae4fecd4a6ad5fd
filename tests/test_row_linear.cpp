#include <cmath>

#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/row_linear.h"
#include "test_util.h"

namespace zp::test {
using namespace zp::kernels;

namespace {

struct RowCase {
  RowInput in;
  int64_t M, N, K;
  bool bias, residual;
};

}  // namespace

// The reference itself: the RMSNorm input is the unfused norm, then the product, all in float64
// (where the unfused norm's rounding of f(x) is no rounding at all).
TEST(RowLinear, CpuEqualsTheUnfusedLayers) {
  const int64_t M = 3, N = 5, K = 16;
  const auto w = to_double(randn(size_t(N * K), 1)), b = to_double(randn(size_t(N), 2));
  const auto r = to_double(randn(size_t(M * N), 3)), nw = to_double(randn(size_t(K), 4, 0.5f, 1.f));
  for (RowInput in : {RowInput::Plain, RowInput::RmsNorm}) {
    const int64_t width = K + 8;  // a padded leading dimension
    const auto x = to_double(randn(size_t(M * width), 5));
    std::vector<double> f(size_t(M * K));
    for (int64_t m = 0; m < M; ++m)
      std::copy(x.begin() + m * width, x.begin() + m * width + K, f.begin() + m * K);
    if (in == RowInput::RmsNorm) {
      std::vector<float> rstd(static_cast<size_t>(M));
      cpu::rmsnorm_forward(nullptr, DType::F64, f.data(), rstd.data(), f.data(), nw.data(), M, K, 1e-5f);
    }
    std::vector<double> want = r;
    cpu::gemm(nullptr, DType::F64, DType::F64, false, true, M, N, K, 1.f, f.data(), K, w.data(), K, 1.f, want.data(),
              N, GemmEpilogue::Bias, b.data());
    std::vector<double> got(size_t(M * N), NAN);
    cpu::row_linear(nullptr, DType::F64, in, RowOutput::Plain, M, N, K, x.data(), width, nw.data(), 1e-5f, w.data(),
                    K, b.data(), got.data(), N, r.data());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-9 * (1 + std::abs(want[i]))) << int(in);
    // The residual may be y itself.
    std::vector<double> inplace = r;
    cpu::row_linear(nullptr, DType::F64, in, RowOutput::Plain, M, N, K, x.data(), width, nw.data(), 1e-5f, w.data(),
                    K, b.data(), inplace.data(), N, inplace.data());
    EXPECT_EQ(inplace, got) << int(in);
  }
}

// The SwiGLU output is the packed product (gate rows, then up rows) followed by silu(gate) * up.
TEST(RowLinear, CpuSwiGluOutputEqualsTheUnfusedLayers) {
  const int64_t M = 3, F = 5, K = 16;
  const auto w = to_double(randn(size_t(2 * F * K), 11)), b = to_double(randn(size_t(2 * F), 12));
  const auto x = to_double(randn(size_t(M * K), 13)), nw = to_double(randn(size_t(K), 14, 0.5f, 1.f));
  for (RowInput in : {RowInput::Plain, RowInput::RmsNorm}) {
    std::vector<double> pre(size_t(M * 2 * F)), want(size_t(M * F)), got(size_t(M * F), NAN);
    cpu::row_linear(nullptr, DType::F64, in, RowOutput::Plain, M, 2 * F, K, x.data(), K, nw.data(), 1e-5f, w.data(), K,
                    b.data(), pre.data(), 2 * F, nullptr);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < F; ++n) {
        const double g = pre[size_t(m * 2 * F + n)], u = pre[size_t(m * 2 * F + F + n)];
        want[size_t(m * F + n)] = g / (1 + std::exp(-g)) * u;
      }
    cpu::row_linear(nullptr, DType::F64, in, RowOutput::SwiGLU, M, F, K, x.data(), K, nw.data(), 1e-5f, w.data(), K,
                    b.data(), got.data(), F, nullptr);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-9 * (1 + std::abs(want[i]))) << int(in);
  }
}

// The RoPE + cache output is the plain product followed by rope_kv_cache_write, in float64 (where the
// unfused product's rounding before the rotation is no rounding at all); a row with a negative slot
// leaves the caches alone.
TEST(RowLinear, CpuRopeCacheOutputEqualsTheUnfusedLayers) {
  const int64_t M = 3, Hq = 4, Hkv = 2, D = 8, N = (Hq + 2 * Hkv) * D, K = 16, slots_n = 6;
  const auto w = to_double(randn(size_t(N * K), 21)), b = to_double(randn(size_t(N), 22));
  const auto x = to_double(randn(size_t(M * K), 23)), nw = to_double(randn(size_t(K), 24, 0.5f, 1.f));
  const std::vector<int32_t> positions{0, 7, 1000}, slots{4, -1, 1};
  for (RowInput in : {RowInput::Plain, RowInput::RmsNorm}) {
    std::vector<double> want(size_t(M * N)), got(size_t(M * N), NAN);
    std::vector<double> want_k(size_t(slots_n * Hkv * D), -7.0), want_v = want_k, got_k = want_k, got_v = want_k;
    cpu::row_linear(nullptr, DType::F64, in, RowOutput::Plain, M, N, K, x.data(), K, nw.data(), 1e-5f, w.data(), K,
                    b.data(), want.data(), N, nullptr);
    cpu::rope_kv_cache_write(nullptr, DType::F64, want.data(), M, Hq, Hkv, D, N, 5e5f, positions.data(),
                             want_k.data(), want_v.data(), slots.data(), 4);
    const RowRopeCache rope{Hq, Hkv, D, 5e5f, positions.data(), slots.data(), got_k.data(), got_v.data()};
    cpu::row_linear(nullptr, DType::F64, in, RowOutput::RopeCache, M, N, K, x.data(), K, nw.data(), 1e-5f, w.data(),
                    K, b.data(), got.data(), N, nullptr, &rope);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-9 * (1 + std::abs(want[i]))) << int(in);
    for (size_t i = 0; i < got_k.size(); ++i) {
      EXPECT_NEAR(got_k[i], want_k[i], 1e-9 * (1 + std::abs(want_k[i]))) << int(in) << " key " << i;
      EXPECT_NEAR(got_v[i], want_v[i], 1e-9 * (1 + std::abs(want_v[i]))) << int(in) << " value " << i;
    }
    EXPECT_EQ(got_k[0], -7.0);  // slot 0: no row's
  }
}

TEST(RowLinear, FitsOnlyWhatTheKernelTakes) {
  alignas(16) static char buf[64];
  EXPECT_TRUE(row_linear_fits(DType::BF16, 8, 2048, 2048, buf, 2048, buf, buf));
  EXPECT_TRUE(row_linear_fits(DType::F16, 1, 8, 8, buf, 8, buf, nullptr));
  EXPECT_FALSE(row_linear_fits(DType::F32, 1, 2048, 2048, buf, 2048, buf, nullptr));
  EXPECT_FALSE(row_linear_fits(DType::BF16, 9, 2048, 2048, buf, 2048, buf, nullptr));
  EXPECT_FALSE(row_linear_fits(DType::BF16, 1, 2044, 2048, buf, 2048, buf, nullptr));
  EXPECT_FALSE(row_linear_fits(DType::BF16, 1, 2048, 2050, buf, 2048, buf, nullptr));
  EXPECT_FALSE(row_linear_fits(DType::BF16, 1, 2048, 2048, buf + 2, 2048, buf, nullptr));
  EXPECT_FALSE(row_linear_fits(DType::BF16, 1, 2048, 2048, buf, 2048, buf, buf + 8));
}

// CUDA against the CPU reference: both inputs, row counts 1 to 8, K with a partial last step of
// the kernel's loop and K long enough to loop, bias, and a residual apart from y or y itself.
TEST(RowLinearGpu, MatchesCpu) {
  ZP_SKIP_WITHOUT_GPU();
  uint64_t seed = 40;
  std::vector<RowCase> cases;
  for (RowInput in : {RowInput::Plain, RowInput::RmsNorm})
    for (auto [N, K] : {std::pair<int64_t, int64_t>{64, 2048}, {1000, 2056}, {24, 8200}})
      for (int64_t M : {1, 3, 8}) cases.push_back({in, M, N, K, M != 3, M != 1});
  for (const RowCase& c : cases)
    for (DType dt : {DType::BF16, DType::F16})
      for (bool inplace : {false, true}) {
        if (inplace && !c.residual) continue;
        const int64_t width = c.K;
        // Activations near a hidden state's scale, so the norm sees a real range.
        auto x = round_to(randn(size_t(c.M * width), seed++, 2.f), dt);
        auto w = round_to(randn(size_t(c.N * c.K), seed++, 0.05f), dt);
        auto b = round_to(randn(size_t(c.N), seed++), dt), r = round_to(randn(size_t(c.M * c.N), seed++), dt);
        auto nw = round_to(randn(size_t(c.K), seed++, 0.3f, 1.f), dt);
        std::vector<float> want(size_t(c.M * c.N));
        cpu::row_linear(nullptr, DType::F32, c.in, RowOutput::Plain, c.M, c.N, c.K, x.data(), width, nw.data(), 1e-5f,
                        w.data(), c.K, c.bias ? b.data() : nullptr, want.data(), c.N,
                        c.residual ? r.data() : nullptr);
        Tensor dx = upload(x, dt), dw = upload(w, dt), db = upload(b, dt), dr = upload(r, dt), dn = upload(nw, dt);
        Tensor dy = inplace ? upload(r, dt) : upload(std::vector<float>(size_t(c.M * c.N), NAN), dt);
        cuda::row_linear(nullptr, dt, c.in, RowOutput::Plain, c.M, c.N, c.K, dx.data(), width, dn.data(), 1e-5f,
                         dw.data(), c.K, c.bias ? db.data() : nullptr, dy.data(), c.N,
                         !c.residual ? nullptr : inplace ? dy.data() : dr.data());
        EXPECT_LE(rel_error(download(dy), want), tolerance(dt))
            << dtype_name(dt) << " input " << int(c.in) << " M=" << c.M << " N=" << c.N << " K=" << c.K
            << (inplace ? " residual in y" : "");
      }
}

// The SwiGLU output on the GPU against the CPU reference: each block's share of outputs (2, 1 and
// K long enough to loop), an output count that leaves the last block half full, bias or none.
TEST(RowLinearGpu, SwiGluOutputMatchesCpu) {
  ZP_SKIP_WITHOUT_GPU();
  uint64_t seed = 90;
  for (RowInput in : {RowInput::Plain, RowInput::RmsNorm})
    for (auto [F, K] : {std::pair<int64_t, int64_t>{63, 2048}, {999, 4096}, {25, 8200}})
      for (int64_t M : {1, 3, 8})
        for (DType dt : {DType::BF16, DType::F16}) {
          const bool bias = M != 3;
          auto x = round_to(randn(size_t(M * K), seed++, 2.f), dt);
          auto w = round_to(randn(size_t(2 * F * K), seed++, 0.05f), dt);
          auto b = round_to(randn(size_t(2 * F), seed++), dt), nw = round_to(randn(size_t(K), seed++, 0.3f, 1.f), dt);
          std::vector<float> want(size_t(M * F));
          cpu::row_linear(nullptr, DType::F32, in, RowOutput::SwiGLU, M, F, K, x.data(), K, nw.data(), 1e-5f, w.data(),
                          K, bias ? b.data() : nullptr, want.data(), F, nullptr);
          Tensor dx = upload(x, dt), dw = upload(w, dt), db = upload(b, dt), dn = upload(nw, dt);
          Tensor dy = upload(std::vector<float>(size_t(M * F), NAN), dt);
          cuda::row_linear(nullptr, dt, in, RowOutput::SwiGLU, M, F, K, dx.data(), K, dn.data(), 1e-5f, dw.data(), K,
                           bias ? db.data() : nullptr, dy.data(), F, nullptr);
          EXPECT_LE(rel_error(download(dy), want), tolerance(dt))
              << dtype_name(dt) << " input " << int(in) << " M=" << M << " F=" << F << " K=" << K;
        }
}

// The RoPE + cache output on the GPU against the CPU reference: Llama 3.2 1B's heads (K = 2048, 4
// rows a block), 128-wide heads with a q/k/v bias as Qwen2 has (K = 4096: 8 rows a block at one row),
// 16-wide heads at K = 1000; positions far into the context, a row with no slot; y and both caches.
TEST(RowLinearGpu, RopeCacheOutputMatchesCpu) {
  ZP_SKIP_WITHOUT_GPU();
  uint64_t seed = 140;
  struct Heads {
    int64_t Hq, Hkv, D, K;
    bool bias;
  };
  for (const Heads& h : {Heads{32, 8, 64, 2048, false}, Heads{4, 2, 128, 4096, true}, Heads{2, 1, 16, 1000, true}})
    for (int64_t M : {1, 3, 8})
      for (DType dt : {DType::BF16, DType::F16}) {
        const int64_t N = (h.Hq + 2 * h.Hkv) * h.D, slots_n = 16, cache_n = slots_n * h.Hkv * h.D;
        std::vector<int32_t> positions, slots;
        for (int64_t m = 0; m < M; ++m) {
          positions.push_back(int32_t(m * 977 + 5));
          slots.push_back(m == 1 ? -1 : int32_t((m * 5 + 3) % slots_n));
        }
        auto x = round_to(randn(size_t(M * h.K), seed++, 2.f), dt);
        auto w = round_to(randn(size_t(N * h.K), seed++, 0.05f), dt);
        auto b = round_to(randn(size_t(N), seed++), dt), nw = round_to(randn(size_t(h.K), seed++, 0.3f, 1.f), dt);
        std::vector<float> want(size_t(M * N)), want_k(size_t(cache_n), 0.f), want_v = want_k;
        const RowRopeCache cpu_rope{h.Hq, h.Hkv, h.D, 5e5f, positions.data(), slots.data(), want_k.data(),
                                    want_v.data()};
        cpu::row_linear(nullptr, DType::F32, RowInput::RmsNorm, RowOutput::RopeCache, M, N, h.K, x.data(), h.K,
                        nw.data(), 1e-5f, w.data(), h.K, h.bias ? b.data() : nullptr, want.data(), N, nullptr,
                        &cpu_rope);
        Tensor dx = upload(x, dt), dw = upload(w, dt), db = upload(b, dt), dn = upload(nw, dt);
        Tensor dy = upload(std::vector<float>(size_t(M * N), NAN), dt);
        Tensor dk = upload(want_k, dt), dv = upload(want_v, dt);  // zeros: the slots no row stores to
        Tensor dpos = upload(std::vector<float>(positions.begin(), positions.end()), DType::I32);
        Tensor dslots = upload(std::vector<float>(slots.begin(), slots.end()), DType::I32);
        const RowRopeCache rope{h.Hq, h.Hkv, h.D, 5e5f, dpos.data<int32_t>(), dslots.data<int32_t>(), dk.data(),
                                dv.data()};
        cuda::row_linear(nullptr, dt, RowInput::RmsNorm, RowOutput::RopeCache, M, N, h.K, dx.data(), h.K, dn.data(),
                         1e-5f, dw.data(), h.K, h.bias ? db.data() : nullptr, dy.data(), N, nullptr, &rope);
        const std::string what = std::string(dtype_name(dt)) + " D=" + std::to_string(h.D) + " M=" + std::to_string(M);
        EXPECT_LE(rel_error(download(dy), want), tolerance(dt)) << what;
        EXPECT_LE(rel_error(download(dk), want_k), tolerance(dt)) << what << " key cache";
        EXPECT_LE(rel_error(download(dv), want_v), tolerance(dt)) << what << " value cache";
      }
}

}  // namespace zp::test

namespace zp::test {

// Decoding with resident weights (ConstantWeightsScope) the products read their weights before the
// kernel ahead of them has finished (programmatic dependent launch on sm_90), and their inputs only
// after it. A chain in which each product's input is the previous kernel's output, on a real stream,
// gives bit for bit what it gives outside the scope: an input read too early would differ. Two
// chains: short kernels (a product, then an RMSNorm), and long products feeding each other (8192 x
// 8192, RMSNorm inputs), where the next product's blocks are resident while the last of the one
// ahead still write: the case that caught x loaded through ld.global.nc ahead of the wait.
TEST(RowLinearGpu, ConstantWeightsScopeReadsInputsAfterTheKernelAhead) {
  ZP_SKIP_WITHOUT_GPU();
  const DType dt = DType::BF16;
  Stream stream(Device::cuda(0));
  const StreamHandle s = stream.handle();
  {
    const int64_t K = 2048, steps = 64;
    std::vector<Tensor> w;
    for (int64_t i = 0; i < 4; ++i)
      w.push_back(upload(round_to(randn(size_t(K * K), 70 + uint64_t(i), 0.05f), dt), dt));
    const Tensor ones = upload(std::vector<float>(size_t(K), 1.f), dt);
    const std::vector<float> start = round_to(randn(size_t(K), 69), dt);
    auto chain = [&](bool constant) {
      const ConstantWeightsScope scope(constant);
      EXPECT_EQ(ConstantWeightsScope::active(), constant);
      Tensor x = upload(start, dt), y = Tensor::empty({K}, dt, Device::cuda(0));
      Tensor rstd = Tensor::empty({1}, DType::F32, Device::cuda(0));
      for (int64_t t = 0; t < steps; ++t) {
        // y = W x + x, then x = rmsnorm(y): each kernel reads what the one before wrote.
        cuda::row_linear(s, dt, RowInput::Plain, RowOutput::Plain, 1, K, K, x.data(), K, nullptr, 0.f,
                         w[size_t(t % 4)].data(), K, nullptr, y.data(), K, x.data());
        cuda::rmsnorm_forward(s, dt, x.data(), rstd.data<float>(), y.data(), ones.data(), 1, K, 1e-5f);
      }
      stream_synchronize(s);
      return download(x);
    };
    const std::vector<float> plain = chain(false), early = chain(true);
    EXPECT_FALSE(ConstantWeightsScope::active());
    EXPECT_EQ(early, plain) << "short kernels";
    // And the chain is not a fixed point: the products did change x.
    EXPECT_GT(rel_error(plain, start), 0.1);
  }
  {
    const int64_t K = 8192, steps = 32;
    const Tensor wa = upload(round_to(randn(size_t(K * K), 80, 0.02f), dt), dt);
    const Tensor wb = upload(round_to(randn(size_t(K * K), 81, 0.02f), dt), dt);
    const Tensor nw = upload(round_to(randn(size_t(K), 82, 0.5f, 1.f), dt), dt);
    const std::vector<float> start = round_to(randn(size_t(K), 83), dt);
    auto chain = [&](bool constant) {
      const ConstantWeightsScope scope(constant);
      Tensor x = upload(start, dt), y = Tensor::empty({K}, dt, Device::cuda(0));
      for (int64_t t = 0; t < steps; ++t) {  // y = Wa rmsnorm(x), x = Wb rmsnorm(y)
        cuda::row_linear(s, dt, RowInput::RmsNorm, RowOutput::Plain, 1, K, K, x.data(), K, nw.data(), 1e-5f,
                         wa.data(), K, nullptr, y.data(), K, nullptr);
        cuda::row_linear(s, dt, RowInput::RmsNorm, RowOutput::Plain, 1, K, K, y.data(), K, nw.data(), 1e-5f,
                         wb.data(), K, nullptr, x.data(), K, nullptr);
      }
      stream_synchronize(s);
      return download(x);
    };
    const std::vector<float> plain = chain(false);
    for (int repeat = 0; repeat < 3; ++repeat) EXPECT_EQ(chain(true), plain) << "long products, repeat " << repeat;
    EXPECT_GT(rel_error(plain, start), 0.1);
  }
}

}  // namespace zp::test
