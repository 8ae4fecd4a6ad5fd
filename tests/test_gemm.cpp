#include <cmath>

#include "kernels/gemm.h"
#include "test_util.h"

namespace zp::test {
using namespace zp::kernels;

namespace {

double gelu_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
}
// d gelu / dx by central differences of gelu_ref (independent of the closed form the kernels use).
double gelu_grad_ref(double x) {
  const double h = 1e-5;
  return (gelu_ref(x + h) - gelu_ref(x - h)) / (2 * h);
}

// One GEMM problem. Operands are stored with padded leading dimensions (ld = natural + pad) and
// start `offset` elements into their buffers, so odd leading dimensions and unaligned pointers
// are exercised too.
struct Case {
  int64_t M, N, K;
  bool ta = false, tb = false;
  float alpha = 1.f, beta = 0.f;
  GemmEpilogue ep = GemmEpilogue::None;
  bool with_aux = false;
  int64_t batch = 1;
  bool share_b = false;  // stride_b = 0: one B for every problem of the batch (a weight)
  int64_t pad = 0, offset = 0;

  int64_t rows_a() const { return ta ? K : M; }
  int64_t lda() const { return (ta ? M : K) + pad; }
  int64_t rows_b() const { return tb ? N : K; }
  int64_t ldb() const { return (tb ? K : N) + pad; }
  int64_t ldc() const { return N + pad; }
  int64_t stride_a() const { return rows_a() * lda(); }
  int64_t stride_b() const { return share_b ? 0 : rows_b() * ldb(); }
  int64_t stride_c() const { return M * ldc(); }
  size_t size_a() const { return size_t(offset + batch * stride_a()); }
  size_t size_b() const { return size_t(offset + (share_b ? 1 : batch) * rows_b() * ldb()); }
  size_t size_c() const { return size_t(offset + batch * stride_c()); }
  bool has_bias() const { return ep == GemmEpilogue::Bias || ep == GemmEpilogue::BiasGelu; }
  bool has_gelu() const { return ep == GemmEpilogue::Gelu || ep == GemmEpilogue::BiasGelu; }
  bool reads_aux() const { return ep == GemmEpilogue::DGelu; }
};

std::string describe(const Case& c) {
  return detail::cat("M=", c.M, " N=", c.N, " K=", c.K, " ta=", c.ta, " tb=", c.tb, " alpha=", c.alpha,
                     " beta=", c.beta, " ep=", int(c.ep), " aux=", c.with_aux, " batch=", c.batch,
                     " share_b=", c.share_b, " pad=", c.pad, " offset=", c.offset);
}

// The textbook triple loop, written independently of kernels/cpu/gemm.cpp. Updates c (and aux).
void naive_gemm(const Case& c, const std::vector<double>& a, const std::vector<double>& b, std::vector<double>& cm,
                const std::vector<double>& bias, std::vector<double>* aux) {
  for (int64_t p = 0; p < c.batch; ++p)
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) {
        double sum = 0;
        for (int64_t k = 0; k < c.K; ++k) {
          double av = c.ta ? a[size_t(c.offset + p * c.stride_a() + k * c.lda() + i)]
                           : a[size_t(c.offset + p * c.stride_a() + i * c.lda() + k)];
          double bv = c.tb ? b[size_t(c.offset + p * c.stride_b() + j * c.ldb() + k)]
                           : b[size_t(c.offset + p * c.stride_b() + k * c.ldb() + j)];
          sum += av * bv;
        }
        double& out = cm[size_t(c.offset + p * c.stride_c() + i * c.ldc() + j)];
        double pre = c.alpha * sum + (c.beta != 0 ? c.beta * out : 0.0);
        if (c.has_bias()) pre += bias[size_t(j)];
        const size_t ai = size_t((p * c.M + i) * c.N + j);
        if (c.reads_aux()) {
          out = pre * gelu_grad_ref((*aux)[ai]);
          continue;
        }
        if (aux) (*aux)[ai] = pre;
        out = c.has_gelu() ? gelu_ref(pre) : pre;
      }
}

void cpu_gemm(const Case& c, DType ab_dt, DType c_dt, const void* a, const void* b, void* cm, const void* bias,
              void* aux) {
  size_t ab = dtype_size(ab_dt), cs = dtype_size(c_dt);
  cpu::gemm(nullptr, ab_dt, c_dt, c.ta, c.tb, c.M, c.N, c.K, c.alpha, static_cast<const char*>(a) + c.offset * ab,
            c.lda(), static_cast<const char*>(b) + c.offset * ab, c.ldb(), c.beta,
            static_cast<char*>(cm) + c.offset * cs, c.ldc(), c.ep, bias, aux, c.batch, c.stride_a(), c.stride_b(),
            c.stride_c());
}

// cpu::gemm in F64 must equal the naive loop to rounding.
void expect_cpu_matches_naive(const Case& c, uint64_t seed) {
  auto a = to_double(randn(c.size_a(), seed)), b = to_double(randn(c.size_b(), seed + 1));
  auto c0 = to_double(randn(c.size_c(), seed + 2)), bias = to_double(randn(size_t(c.N), seed + 3));
  std::vector<double> got = c0, want = c0;
  std::vector<double> aux_got(size_t(c.batch * c.M * c.N)), aux_want(aux_got.size());
  if (c.reads_aux()) aux_got = aux_want = to_double(randn(aux_got.size(), seed + 4));
  cpu_gemm(c, DType::F64, DType::F64, a.data(), b.data(), got.data(), c.has_bias() ? bias.data() : nullptr,
           c.with_aux ? aux_got.data() : nullptr);
  naive_gemm(c, a, b, want, bias, c.with_aux ? &aux_want : nullptr);
  EXPECT_LE(rel_error(got, want), c.reads_aux() ? 1e-9 : 1e-13) << describe(c);  // DGelu: vs a finite difference
  if (c.with_aux) EXPECT_LE(rel_error(aux_got, aux_want), 1e-13) << describe(c);
}

}  // namespace

TEST(Gemm, CpuHandChecked) {
  // [[1,2],[3,4]] @ [[5,6],[7,8]] = [[19,22],[43,50]]; then alpha = 2, beta = 1 on C = 1, bias [10, 20].
  std::vector<float> a = {1, 2, 3, 4}, b = {5, 6, 7, 8}, c(4, 1.f), bias = {10, 20};
  cpu::gemm(nullptr, DType::F32, DType::F32, false, false, 2, 2, 2, 1.f, a.data(), 2, b.data(), 2, 0.f, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{19, 22, 43, 50}));
  std::fill(c.begin(), c.end(), 1.f);
  cpu::gemm(nullptr, DType::F32, DType::F32, false, false, 2, 2, 2, 2.f, a.data(), 2, b.data(), 2, 1.f, c.data(), 2,
            GemmEpilogue::Bias, bias.data());
  EXPECT_EQ(c, (std::vector<float>{49, 65, 97, 121}));
  // A^T @ B^T = (B A)^T: B A = [[23,34],[31,46]].
  cpu::gemm(nullptr, DType::F32, DType::F32, true, true, 2, 2, 2, 1.f, a.data(), 2, b.data(), 2, 0.f, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{23, 31, 34, 46}));
  // GELU values: gelu(1) = 0.841192, gelu(-1) = -0.158808, gelu(0) = 0; aux keeps the inputs.
  std::vector<float> x = {1, -1, 0}, one = {1}, g(3), aux(3);
  cpu::gemm(nullptr, DType::F32, DType::F32, false, false, 3, 1, 1, 1.f, x.data(), 1, one.data(), 1, 0.f, g.data(), 1,
            GemmEpilogue::Gelu, nullptr, aux.data());
  EXPECT_NEAR(g[0], 0.8411920f, 1e-6f);
  EXPECT_NEAR(g[1], -0.1588080f, 1e-6f);
  EXPECT_EQ(g[2], 0.f);
  EXPECT_EQ(aux, x);
  // DGelu: C = (A B) * gelu'(aux) with A B = 2: gelu'(1) = 1.082964, gelu'(-1) = -0.082964, gelu'(0) = 0.5.
  std::vector<float> ones = {1, 1, 1}, two = {2};
  cpu::gemm(nullptr, DType::F32, DType::F32, false, false, 3, 1, 1, 1.f, ones.data(), 1, two.data(), 1, 0.f, g.data(),
            1, GemmEpilogue::DGelu, nullptr, x.data());
  EXPECT_NEAR(g[0], 2.165929f, 1e-5f);
  EXPECT_NEAR(g[1], -0.165929f, 1e-5f);
  EXPECT_EQ(g[2], 1.f);
}

TEST(Gemm, CpuMatchesNaiveAllTransposes) {
  uint64_t seed = 1;
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{7, 5, 3}, {33, 17, 65}, {1, 1, 1}, {1, 9, 4}})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (float beta : {0.f, -1.3f})
          for (int64_t pad : {0, 3}) {
            Case c{M, N, K, ta, tb, 0.7f, beta};
            c.pad = pad;
            c.offset = pad;
            expect_cpu_matches_naive(c, seed += 10);
          }
}

TEST(Gemm, CpuDGeluMatchesNaive) {
  uint64_t seed = 900;
  for (bool ta : {false, true}) {
    Case c{9, 6, 5, ta, !ta, 0.7f, 0.f, GemmEpilogue::DGelu, true, 2};
    c.pad = 1;
    expect_cpu_matches_naive(c, seed += 10);
  }
}

TEST(Gemm, CpuBetaZeroIgnoresNanInC) {
  std::vector<double> a = {1, 2}, b = {3, 4}, c = {NAN};
  cpu::gemm(nullptr, DType::F64, DType::F64, false, false, 1, 1, 2, 1.f, a.data(), 2, b.data(), 1, 0.f, c.data(), 1);
  EXPECT_EQ(c[0], 11.0);
}

TEST(Gemm, CpuEpilogues) {
  uint64_t seed = 1000;
  for (GemmEpilogue ep : {GemmEpilogue::Bias, GemmEpilogue::Gelu, GemmEpilogue::BiasGelu})
    for (bool with_aux : {false, true})
      for (bool tb : {false, true}) {
        if (with_aux && ep == GemmEpilogue::Bias) continue;
        Case c{13, 11, 9, false, tb, 1.1f, 0.5f, ep, with_aux};
        expect_cpu_matches_naive(c, seed += 10);
      }
}

TEST(Gemm, CpuBatchedStrided) {
  uint64_t seed = 2000;
  for (bool share_b : {false, true})
    for (bool ta : {false, true}) {
      Case c{6, 10, 7, ta, !ta, 1.f, 0.25f, GemmEpilogue::BiasGelu, true, 3, share_b, 1, 2};
      expect_cpu_matches_naive(c, seed += 10);
    }
}

TEST(Gemm, CpuFp32AccumulateOverBf16Operands) {
  // The weight-gradient pattern: dW (fp32) += X^T @ dY with bf16 X, dY, twice (two micro-batches).
  const int64_t M = 19, N = 23, K = 31;  // dW is [M,N], X is [K,M], dY is [K,N]
  auto x = round_to(randn(size_t(K * M), 1), DType::BF16), dy = round_to(randn(size_t(K * N), 2), DType::BF16);
  std::vector<bf16> xb(x.begin(), x.end()), dyb(dy.begin(), dy.end());
  std::vector<float> dw = randn(size_t(M * N), 3);
  std::vector<double> want(dw.begin(), dw.end());
  for (int rep = 0; rep < 2; ++rep)
    cpu::gemm(nullptr, DType::BF16, DType::F32, true, false, M, N, K, 1.f, xb.data(), M, dyb.data(), N, 1.f, dw.data(),
              N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(x[size_t(k * M + i)]) * dy[size_t(k * N + j)];
      want[size_t(i * N + j)] += 2 * s;
    }
  EXPECT_LE(rel_error(dw, want), 1e-6);
}

TEST(Gemm, CpuBiasGradAccumulates) {
  std::vector<float> dy = {1, 2, 3, 4, 5, 6}, db = {10, 20, 30};  // dy is [2,3]
  cpu::bias_grad(nullptr, DType::F32, db.data(), dy.data(), 2, 3);
  EXPECT_EQ(db, (std::vector<float>{15, 27, 39}));
  std::vector<bf16> dyb(dy.begin(), dy.end());
  cpu::bias_grad(nullptr, DType::BF16, db.data(), dyb.data(), 2, 3);
  EXPECT_EQ(db, (std::vector<float>{20, 34, 48}));
}

// The linear layer's backward is made of these ops: for Y = X W + b, dX = dY W^T, dW = X^T dY, db =
// colsum(dY). Checked against finite differences of loss = sum(G * Y) in F64.
TEST(Gemm, CpuLinearBackwardMatchesFiniteDifferences) {
  const int64_t T = 5, I = 7, O = 6;
  auto x = to_double(randn(size_t(T * I), 1)), w = to_double(randn(size_t(I * O), 2));
  auto b = to_double(randn(size_t(O), 3)), g = to_double(randn(size_t(T * O), 4));
  auto loss = [&] {
    std::vector<double> y(size_t(T * O));
    cpu::gemm(nullptr, DType::F64, DType::F64, false, false, T, O, I, 1.f, x.data(), I, w.data(), O, 0.f, y.data(), O,
              GemmEpilogue::Bias, b.data());
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += g[i] * y[i];
    return l;
  };
  std::vector<double> dx(x.size()), dw(w.size(), 0.0);
  std::vector<float> db(size_t(O), 0.f);
  cpu::gemm(nullptr, DType::F64, DType::F64, false, true, T, I, O, 1.f, g.data(), O, w.data(), O, 0.f, dx.data(), I);
  cpu::gemm(nullptr, DType::F64, DType::F64, true, false, I, O, T, 1.f, x.data(), I, g.data(), O, 1.f, dw.data(), O);
  cpu::bias_grad(nullptr, DType::F64, db.data(), g.data(), T, O);
  expect_grad_matches_fd(x, dx, loss, "dX");
  expect_grad_matches_fd(w, dw, loss, "dW");
  expect_grad_matches_fd(b, std::vector<double>(db.begin(), db.end()), loss, "db", 1e-6, 1e-6);
}

// ---------------------------------------------------------------------------------------------
// CUDA vs the CPU reference.

namespace {

void* at(const Tensor& t, int64_t offset) { return static_cast<char*>(t.data()) + offset * dtype_size(t.dtype()); }

// Runs `c` on the GPU with operands in ab_dt and C in c_dt and compares C (and aux) with the CPU
// reference fed the same rounded values.
void expect_gpu_matches_cpu(const Case& c, DType ab_dt, DType c_dt, uint64_t seed) {
  auto a = round_to(randn(c.size_a(), seed), ab_dt), b = round_to(randn(c.size_b(), seed + 1), ab_dt);
  auto c0 = round_to(randn(c.size_c(), seed + 2), c_dt), bias = round_to(randn(size_t(c.N), seed + 3), ab_dt);
  const size_t aux_n = size_t(c.batch * c.M * c.N);

  std::vector<float> want = c0, want_aux(aux_n);
  if (c.reads_aux()) want_aux = round_to(randn(aux_n, seed + 4), c_dt);
  cpu_gemm(c, DType::F32, DType::F32, a.data(), b.data(), want.data(), c.has_bias() ? bias.data() : nullptr,
           c.with_aux ? want_aux.data() : nullptr);

  Tensor da = upload(a, ab_dt), db = upload(b, ab_dt), dc = upload(c0, c_dt), dbias = upload(bias, ab_dt);
  Tensor daux = c.reads_aux() ? upload(want_aux, c_dt) : Tensor::zeros({int64_t(aux_n)}, c_dt, Device::cuda());
  cuda::gemm(nullptr, ab_dt, c_dt, c.ta, c.tb, c.M, c.N, c.K, c.alpha, at(da, c.offset), c.lda(), at(db, c.offset),
             c.ldb(), c.beta, at(dc, c.offset), c.ldc(), c.ep, c.has_bias() ? dbias.data() : nullptr,
             c.with_aux ? daux.data() : nullptr, c.batch, c.stride_a(), c.stride_b(), c.stride_c());
  auto got = download(dc);
  std::string what = detail::cat(describe(c), " ab=", dtype_name(ab_dt), " c=", dtype_name(c_dt));
  // With an fp32 C the only rounding is the operands', which the reference sees too; so C's dtype
  // decides the tolerance. Except: cuBLASLt's fused GELU evaluates tanh approximately (seen on an
  // H200: up to 3e-5 relative on a 1x3 output), so an fp32 C after GELU gets 1e-4.
  double tol_c = (c.has_gelu() || c.reads_aux()) && c_dt == DType::F32 ? 1e-4 : tolerance(c_dt);
  EXPECT_LE(rel_error(got, want), tol_c) << what;
  if (c.with_aux && !c.reads_aux()) EXPECT_LE(rel_error(download(daux), want_aux), tolerance(c_dt)) << what << " (aux)";
  // Padding columns between rows and the elements before the first matrix are left untouched.
  for (int64_t i = 0; i < c.offset; ++i) EXPECT_EQ(got[size_t(i)], c0[size_t(i)]) << what;
  if (c.pad > 0) EXPECT_EQ(got[size_t(c.offset + c.N)], c0[size_t(c.offset + c.N)]) << what;
}

std::vector<DType> c_dtypes_for(DType ab_dt) {
  if (ab_dt == DType::F32) return {DType::F32};
  return {ab_dt, DType::F32};
}

}  // namespace

TEST(GemmGpu, MatchesCpuAllTransposes) {
  ZP_SKIP_WITHOUT_GPU();
  uint64_t seed = 100;
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 3, 5}, {7, 5, 3}, {129, 257, 63}, {512, 768, 768}})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (DType ab : gpu_float_dtypes())
          for (DType cd : c_dtypes_for(ab)) {
            Case c{M, N, K, ta, tb, 1.25f, (M + K) % 2 ? 0.5f : 0.f};
            expect_gpu_matches_cpu(c, ab, cd, seed += 10);
          }
}

TEST(GemmGpu, PaddedLeadingDimensionsAndUnalignedPointers) {
  ZP_SKIP_WITHOUT_GPU();
  uint64_t seed = 200;
  for (auto [pad, offset] : {std::pair<int64_t, int64_t>{1, 1}, {8, 0}, {3, 5}})
    for (bool ta : {false, true})
      for (DType ab : gpu_float_dtypes())
        for (DType cd : c_dtypes_for(ab)) {
          Case c{37, 64, 48, ta, !ta, 1.f, 0.75f};
          c.pad = pad;
          c.offset = offset;
          expect_gpu_matches_cpu(c, ab, cd, seed += 10);
        }
}

TEST(GemmGpu, Epilogues) {
  ZP_SKIP_WITHOUT_GPU();
  uint64_t seed = 300;
  // N = 768 (a multiple of 8) takes cuBLASLt's fused epilogues where it has them; N = 257 and N = 3
  // make the aux leading dimension odd, which takes our own epilogue kernel.
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 3, 5}, {129, 257, 63}, {64, 768, 128}})
    for (GemmEpilogue ep : {GemmEpilogue::Bias, GemmEpilogue::Gelu, GemmEpilogue::BiasGelu, GemmEpilogue::DGelu})
      for (bool with_aux : {false, true}) {
        if ((with_aux && ep == GemmEpilogue::Bias) || (!with_aux && ep == GemmEpilogue::DGelu)) continue;
        for (DType ab : gpu_float_dtypes())
          for (DType cd : c_dtypes_for(ab)) {
            Case c{M, N, K, false, true, 1.f, 0.f, ep, with_aux};
            expect_gpu_matches_cpu(c, ab, cd, seed += 10);
            if (ep != GemmEpilogue::DGelu) c.beta = 0.5f;  // the epilogue applies after beta * C
            c.ta = true;
            expect_gpu_matches_cpu(c, ab, cd, seed += 10);
          }
      }
}

TEST(GemmGpu, BatchedStrided) {
  ZP_SKIP_WITHOUT_GPU();
  uint64_t seed = 400;
  for (int64_t N : {33, 64})
    for (bool share_b : {false, true})
      for (GemmEpilogue ep : {GemmEpilogue::None, GemmEpilogue::BiasGelu})
        for (DType ab : gpu_float_dtypes())
          for (DType cd : c_dtypes_for(ab)) {
            Case c{40, N, 24, false, share_b, 1.f, 0.5f, ep, ep != GemmEpilogue::None, 4, share_b};
            expect_gpu_matches_cpu(c, ab, cd, seed += 10);
          }
}

TEST(GemmGpu, ZeroK) {
  ZP_SKIP_WITHOUT_GPU();
  for (DType ab : gpu_float_dtypes())
    for (DType cd : c_dtypes_for(ab)) {
      Case c{5, 6, 0, false, false, 1.f, 0.5f, GemmEpilogue::BiasGelu, true};
      c.pad = 1;  // lda >= 1 even when K == 0
      expect_gpu_matches_cpu(c, ab, cd, 500);
    }
}

TEST(GemmGpu, Fp32AccumulationOverMicroBatches) {
  ZP_SKIP_WITHOUT_GPU();
  // dW (fp32, [M,N]) += X^T dY for three micro-batches of bf16 / f16 X [K,M] and dY [K,N].
  const int64_t M = 96, N = 200, K = 333;
  for (DType ab : {DType::BF16, DType::F16}) {
    std::vector<float> dw = randn(size_t(M * N), 7), want = dw;
    Tensor ddw = upload(dw, DType::F32);
    for (uint64_t mb = 0; mb < 3; ++mb) {
      auto x = round_to(randn(size_t(K * M), 10 + mb), ab), dy = round_to(randn(size_t(K * N), 20 + mb), ab);
      Tensor dx = upload(x, ab), ddy = upload(dy, ab);
      cuda::gemm(nullptr, ab, DType::F32, true, false, M, N, K, 1.f, dx.data(), M, ddy.data(), N, 1.f, ddw.data(), N);
      cpu::gemm(nullptr, DType::F32, DType::F32, true, false, M, N, K, 1.f, x.data(), M, dy.data(), N, 1.f,
                want.data(), N);
    }
    EXPECT_LE(rel_error(download(ddw), want), tolerance(DType::F32)) << dtype_name(ab);
  }
}

TEST(GemmGpu, BiasGradMatchesCpu) {
  ZP_SKIP_WITHOUT_GPU();
  uint64_t seed = 600;
  for (auto [M, N] : {std::pair<int64_t, int64_t>{1, 3}, {1000, 768}, {4097, 33}, {8, 5000}, {20000, 64}})
    for (DType dt : gpu_float_dtypes()) {
      auto dy = round_to(randn(size_t(M * N), seed += 10), dt);
      std::vector<float> db = randn(size_t(N), seed + 1), want = db;
      Tensor ddy = upload(dy, dt), ddb = upload(db, DType::F32);
      cuda::bias_grad(nullptr, dt, ddb.data<float>(), ddy.data(), M, N);
      cpu::bias_grad(nullptr, DType::F32, want.data(), dy.data(), M, N);
      // Inputs are already rounded to dt and both sides sum in at least fp32, so fp32's tolerance holds.
      EXPECT_LE(rel_error(download(ddb), want), tolerance(DType::F32)) << dtype_name(dt) << " M=" << M << " N=" << N;
      // Deterministic: the same call again adds exactly the same amount.
      auto once = download(ddb);
      cuda::bias_grad(nullptr, dt, ddb.data<float>(), ddy.data(), M, N);
      cuda::bias_grad(nullptr, dt, ddb.data<float>(), ddy.data(), M, N);
      Tensor again = upload(once, DType::F32);
      cuda::bias_grad(nullptr, dt, again.data<float>(), ddy.data(), M, N);
      cuda::bias_grad(nullptr, dt, again.data<float>(), ddy.data(), M, N);
      EXPECT_EQ(download(ddb), download(again)) << dtype_name(dt) << " M=" << M << " N=" << N;
    }
}

}  // namespace zp::test

namespace zp::test {

// A separate C input (a residual added by the epilogue) equals copying it into C first, and the
// output's old contents are never read: on the CPU (exact) and against the CPU on the GPU.
TEST(Gemm, SeparateCInputActsAsC) {
  for (GemmEpilogue ep : {GemmEpilogue::None, GemmEpilogue::Bias}) {
    const int64_t M = 9, N = 16, K = 12;
    auto a = randn(size_t(M * K), 1), b = randn(size_t(N * K), 2), r = randn(size_t(M * N), 3), bias = randn(16, 4);
    std::vector<float> want = r, got(size_t(M * N), NAN);
    cpu::gemm(nullptr, DType::F32, DType::F32, false, true, M, N, K, 1.f, a.data(), K, b.data(), K, 1.f, want.data(), N,
              ep, bias.data());
    cpu::gemm(nullptr, DType::F32, DType::F32, false, true, M, N, K, 1.f, a.data(), K, b.data(), K, 1.f, got.data(), N,
              ep, bias.data(), nullptr, 1, 0, 0, 0, r.data());
    EXPECT_EQ(got, want);
  }
}

TEST(GemmGpu, SeparateCInputActsAsC) {
  ZP_SKIP_WITHOUT_GPU();
  for (DType dt : gpu_float_dtypes())
    for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{9, 16, 12}, {256, 768, 768}}) {
      auto a = round_to(randn(size_t(M * K), 5), dt), b = round_to(randn(size_t(N * K), 6), dt);
      auto r = round_to(randn(size_t(M * N), 7), dt), bias = round_to(randn(size_t(N), 8), dt);
      std::vector<float> want = r;
      cpu::gemm(nullptr, DType::F32, DType::F32, false, true, M, N, K, 1.f, a.data(), K, b.data(), K, 1.f, want.data(),
                N, GemmEpilogue::Bias, bias.data());
      Tensor da = upload(a, dt), db = upload(b, dt), dr = upload(r, dt), dbias = upload(bias, dt);
      Tensor dc = upload(std::vector<float>(size_t(M * N), NAN), dt);
      cuda::gemm(nullptr, dt, dt, false, true, M, N, K, 1.f, da.data(), K, db.data(), K, 1.f, dc.data(), N,
                 GemmEpilogue::Bias, dbias.data(), nullptr, 1, 0, 0, 0, dr.data());
      EXPECT_LE(rel_error(download(dc), want), tolerance(dt)) << dtype_name(dt) << " M=" << M;
    }
}

}  // namespace zp::test

namespace zp::test {

// A decode step's products (at most 8 rows of x against a weight, 16-bit, alpha 1, no GELU) run in
// decode_gemv.cu rather than cuBLASLt: every row count it takes, K with a partial last step of its
// unrolled loop, padded leading dimensions, bias, and a residual read from c_in or from C itself.
TEST(GemmGpu, DecodeRowsMatchCpu) {
  ZP_SKIP_WITHOUT_GPU();
  uint64_t seed = 900;
  for (DType dt : {DType::BF16, DType::F16})
    for (auto [N, K] : {std::pair<int64_t, int64_t>{5, 8}, {1000, 2056}, {64, 4096}})
      for (int64_t M : {1, 2, 3, 8})
        for (int variant = 0; variant < 3; ++variant) {
          const int64_t lda = K + (variant == 1 ? 8 : 0), ldc = N + (variant == 1 ? 3 : 0);
          auto a = round_to(randn(size_t(M * lda), seed++), dt), b = round_to(randn(size_t(N * K), seed++), dt);
          auto r = round_to(randn(size_t(M * ldc), seed++), dt), bias = round_to(randn(size_t(N), seed++), dt);
          const bool with_bias = variant != 0, residual = variant != 0;
          const float beta = residual ? 1.f : 0.f;
          std::vector<float> want = r;
          cpu::gemm(nullptr, DType::F32, DType::F32, false, true, M, N, K, 1.f, a.data(), lda, b.data(), K, beta,
                    want.data(), ldc, with_bias ? GemmEpilogue::Bias : GemmEpilogue::None, bias.data());
          Tensor da = upload(a, dt), db = upload(b, dt), dr = upload(r, dt), dbias = upload(bias, dt);
          // variant 2 reads the residual from a separate input and finds NaNs in C; variant 1 reads C.
          Tensor dc = variant == 2 ? upload(std::vector<float>(size_t(M * ldc), NAN), dt) : upload(r, dt);
          cuda::gemm(nullptr, dt, dt, false, true, M, N, K, 1.f, da.data(), lda, db.data(), K, beta, dc.data(), ldc,
                     with_bias ? GemmEpilogue::Bias : GemmEpilogue::None, with_bias ? dbias.data() : nullptr, nullptr, 1,
                     0, 0, 0, variant == 2 ? dr.data() : nullptr);
          auto got = download(dc);
          const std::string what = detail::cat(dtype_name(dt), " M=", M, " N=", N, " K=", K, " variant ", variant);
          if (variant == 1) {  // the padding columns of C are left as they were
            for (int64_t m = 0; m < M; ++m)
              for (int64_t n = N; n < ldc; ++n) ASSERT_EQ(got[size_t(m * ldc + n)], r[size_t(m * ldc + n)]) << what;
            for (int64_t m = 0; m < M; ++m)
              for (int64_t n = N; n < ldc; ++n) got[size_t(m * ldc + n)] = want[size_t(m * ldc + n)];
          }
          if (variant == 2)  // the padding-free layout: every element written
            for (float v : got) ASSERT_FALSE(std::isnan(v)) << what;
          EXPECT_LE(rel_error(got, want), tolerance(dt)) << what;
        }
}

}  // namespace zp::test
