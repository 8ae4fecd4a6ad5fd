// LayerNorm, RMSNorm and GroupNorm (+SiLU): hand-checked forwards, backward vs finite differences in
// F64 on the CPU, accumulation semantics, and CUDA vs the CPU reference for F32, BF16 and F16.
#include <cmath>
#include <cstdlib>

#include "kernels/groupnorm.h"
#include "kernels/layernorm.h"
#include "kernels/rmsnorm.h"
#include "test_util.h"

namespace zp::test {
using namespace zp::kernels;

namespace {

size_t sz(int64_t n) { return static_cast<size_t>(n); }

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

double silu(double z) { return z / (1.0 + std::exp(-z)); }

// ||a - b|| / max(||b||, floor). dx of a norm is rstd * (dy * w) minus its projections, which can
// cancel almost completely (C = 1, or x nearly constant); `floor` is the scale of the terms that
// cancel, so fp32 rounding of those terms does not count as a large relative error.
double rel_error_floor(const std::vector<float>& a, const std::vector<float>& b, double floor) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num) / std::max(std::sqrt(den), floor);
}

// || rstd[row] * dy * w ||: the natural scale of a row-norm's dx.
double row_grad_scale(const std::vector<float>& dy, const std::vector<float>& w, const std::vector<float>& rstd,
                      int64_t N, int64_t C) {
  double s = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      double v = double(rstd[sz(n)]) * dy[sz(n * C + c)] * w[sz(c)];
      s += v * v;
    }
  return std::sqrt(s);
}

Tensor gpu_empty(int64_t n, DType dt) { return Tensor::empty({n}, dt, Device::cuda()); }

// Statistics are fp32 on both sides from identical inputs: only summation order differs.
constexpr double kStatsTol = 1e-5;

}  // namespace

// ---------------------------------------------------------------------------------------------
// LayerNorm

TEST(LayerNorm, HandCheckedForward) {
  // Row 0: mean 2.5, var 1.25. Row 1 is constant: y = bias.
  std::vector<float> x = {1, 2, 3, 4, 5, 5, 5, 5}, w = {1, 1, 2, 2}, b = {0, 1, 0, -1}, y(8), mean(2), rstd(2);
  cpu::layernorm_forward(nullptr, DType::F32, y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), 2, 4,
                         0.f);
  const float r = 1.f / std::sqrt(1.25f);
  EXPECT_FLOAT_EQ(mean[0], 2.5f);
  EXPECT_FLOAT_EQ(rstd[0], r);
  const std::vector<float> want = {-1.5f * r, -0.5f * r + 1, 1.0f * r, 3.0f * r - 1};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[sz(i)], want[sz(i)], 1e-6) << i;
  // eps keeps the constant row finite.
  cpu::layernorm_forward(nullptr, DType::F32, y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), 2, 4,
                         1e-5f);
  EXPECT_FLOAT_EQ(mean[1], 5.f);
  EXPECT_NEAR(rstd[1], 1.f / std::sqrt(1e-5f), 1e-2);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(y[sz(4 + i)], b[sz(i)]);
  // No bias.
  cpu::layernorm_forward(nullptr, DType::F32, y.data(), mean.data(), rstd.data(), x.data(), w.data(), nullptr, 2, 4,
                         0.f);
  EXPECT_NEAR(y[1], -0.5f * r, 1e-6);
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  for (bool has_bias : {true, false}) {
    const int64_t N = 3, C = 7;
    auto x = to_double(randn(sz(N * C), 1, 1.f, 0.5f));
    auto w = to_double(randn(sz(C), 2, 0.5f, 1.f));
    auto b = to_double(randn(sz(C), 3));
    auto R = to_double(randn(sz(N * C), 4));  // loss = sum(y * R), so dy = R
    std::vector<double> y(sz(N * C));
    std::vector<float> mean(sz(N)), rstd(sz(N));
    auto loss = [&] {
      cpu::layernorm_forward(nullptr, DType::F64, y.data(), mean.data(), rstd.data(), x.data(), w.data(),
                             has_bias ? b.data() : nullptr, N, C, 1e-5f);
      return dot(y, R);
    };
    loss();
    std::vector<double> dx(sz(N * C));
    std::vector<float> dw(sz(C), 0.f), db(sz(C), 0.f);
    cpu::layernorm_backward(nullptr, DType::F64, dx.data(), dw.data(), has_bias ? db.data() : nullptr, R.data(),
                            x.data(), w.data(), mean.data(), rstd.data(), N, C, false);
    expect_grad_matches_fd(x, dx, loss, "layernorm dx");
    expect_grad_matches_fd(w, to_double(dw), loss, "layernorm dweight");
    if (has_bias) expect_grad_matches_fd(b, to_double(db), loss, "layernorm dbias");
  }
}

TEST(LayerNorm, BackwardAccumulates) {
  const int64_t N = 4, C = 5;
  auto x = to_double(randn(sz(N * C), 5)), w = to_double(randn(sz(C), 6)), dy = to_double(randn(sz(N * C), 7));
  auto dx0 = to_double(randn(sz(N * C), 8));
  auto dw0 = randn(sz(C), 9), db0 = randn(sz(C), 10);
  std::vector<double> y(sz(N * C));
  std::vector<float> mean(sz(N)), rstd(sz(N));
  cpu::layernorm_forward(nullptr, DType::F64, y.data(), mean.data(), rstd.data(), x.data(), w.data(), nullptr, N, C,
                         1e-5f);
  std::vector<double> dx_write(sz(N * C), 123.0), dx_acc = dx0;
  std::vector<float> dw_fresh(sz(C), 0.f), db_fresh(sz(C), 0.f), dw = dw0, db = db0;
  cpu::layernorm_backward(nullptr, DType::F64, dx_write.data(), dw_fresh.data(), db_fresh.data(), dy.data(), x.data(),
                          w.data(), mean.data(), rstd.data(), N, C, false);
  cpu::layernorm_backward(nullptr, DType::F64, dx_acc.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), N, C, true);
  for (size_t i = 0; i < dx0.size(); ++i) EXPECT_NEAR(dx_acc[i], dx0[i] + dx_write[i], 1e-12) << i;
  for (size_t c = 0; c < sz(C); ++c) {
    EXPECT_NEAR(dw[c], dw0[c] + dw_fresh[c], 1e-6) << c;
    EXPECT_NEAR(db[c], db0[c] + db_fresh[c], 1e-6) << c;
  }
}

TEST(LayerNormGpu, MatchesCpu) {
  ZP_SKIP_WITHOUT_GPU();
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1},    {3, 7},    {17, 768}, {64, 1023},
                                                           {5, 4096}, {33, 2048}, {300, 96}, {3, 12288}};
  const float eps = 1e-5f;
  uint64_t seed = 100;
  for (auto [N, C] : shapes) {
    for (DType dt : gpu_float_dtypes()) {
      for (bool has_bias : {true, false}) {
        for (bool acc : {false, true}) {
          seed += 10;
          const size_t NC = sz(N * C);
          auto x = round_to(randn(NC, seed, 1.f, 0.5f), dt), w = round_to(randn(sz(C), seed + 1, 0.2f, 1.f), dt);
          auto b = round_to(randn(sz(C), seed + 2, 0.2f), dt), dy = round_to(randn(NC, seed + 3), dt);
          auto dx0 = round_to(randn(NC, seed + 4), dt);
          auto dw0 = randn(sz(C), seed + 5), db0 = randn(sz(C), seed + 6);
          const float* bias = has_bias ? b.data() : nullptr;

          std::vector<float> y(NC), mean(sz(N)), rstd(sz(N)), dx = dx0, dw = dw0, db = db0;
          cpu::layernorm_forward(nullptr, DType::F32, y.data(), mean.data(), rstd.data(), x.data(), w.data(), bias, N,
                                 C, eps);
          cpu::layernorm_backward(nullptr, DType::F32, dx.data(), dw.data(), has_bias ? db.data() : nullptr,
                                  dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C, acc);

          Tensor gx = upload(x, dt), gw = upload(w, dt), gb = upload(b, dt), gdy = upload(dy, dt);
          Tensor gdx = upload(dx0, dt), gdw = upload(dw0, DType::F32), gdb = upload(db0, DType::F32);
          Tensor gy = gpu_empty(int64_t(NC), dt), gmean = gpu_empty(N, DType::F32), grstd = gpu_empty(N, DType::F32);
          cuda::layernorm_forward(nullptr, dt, gy.data(), gmean.data<float>(), grstd.data<float>(), gx.data(),
                                  gw.data(), has_bias ? gb.data() : nullptr, N, C, eps);
          cuda::layernorm_backward(nullptr, dt, gdx.data(), gdw.data<float>(), has_bias ? gdb.data<float>() : nullptr,
                                   gdy.data(), gx.data(), gw.data(), gmean.data<float>(), grstd.data<float>(), N, C,
                                   acc);

          std::string what = std::string(dtype_name(dt)) + " N=" + std::to_string(N) + " C=" + std::to_string(C) +
                             (has_bias ? " bias" : " no-bias") + (acc ? " accumulate" : "");
          EXPECT_LE(rel_error(download(gy), y), tolerance(dt)) << "y " << what;
          EXPECT_LE(rel_error(download(gmean), mean), kStatsTol) << "mean " << what;
          EXPECT_LE(rel_error(download(grstd), rstd), kStatsTol) << "rstd " << what;
          EXPECT_LE(rel_error_floor(download(gdx), dx, row_grad_scale(dy, w, rstd, N, C)), tolerance(dt))
              << "dx " << what;
          EXPECT_LE(rel_error(download(gdw), dw), tolerance(dt)) << "dweight " << what;
          if (has_bias) EXPECT_LE(rel_error(download(gdb), db), tolerance(dt)) << "dbias " << what;
          else EXPECT_EQ(download(gdb), db0) << "dbias must be untouched " << what;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

TEST(RMSNorm, HandCheckedForward) {
  // Row 0: mean(x^2) = 4, rstd = 1/2.
  std::vector<float> x = {2, -2, 2, -2, 3, 4, 0, 0}, w = {1, 2, 3, 0.5f}, y(8), rstd(2);
  cpu::rmsnorm_forward(nullptr, DType::F32, y.data(), rstd.data(), x.data(), w.data(), 2, 4, 0.f);
  EXPECT_FLOAT_EQ(rstd[0], 0.5f);
  const std::vector<float> want0 = {1, -2, 3, -0.5f};
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(y[sz(i)], want0[sz(i)]) << i;
  // Row 1: mean(x^2) = 25 / 4, rstd = 2 / 5.
  EXPECT_FLOAT_EQ(rstd[1], 0.4f);
  EXPECT_FLOAT_EQ(y[4], 1.2f);
  EXPECT_FLOAT_EQ(y[5], 3.2f);
  EXPECT_FLOAT_EQ(y[6], 0.f);
}

TEST(RMSNorm, BackwardMatchesFiniteDifferences) {
  const int64_t N = 3, C = 7;
  auto x = to_double(randn(sz(N * C), 21, 1.f, 0.3f));
  auto w = to_double(randn(sz(C), 22, 0.5f, 1.f));
  auto R = to_double(randn(sz(N * C), 23));
  std::vector<double> y(sz(N * C));
  std::vector<float> rstd(sz(N));
  auto loss = [&] {
    cpu::rmsnorm_forward(nullptr, DType::F64, y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
    return dot(y, R);
  };
  loss();
  std::vector<double> dx(sz(N * C));
  std::vector<float> dw(sz(C), 0.f);
  cpu::rmsnorm_backward(nullptr, DType::F64, dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), N, C,
                        false);
  expect_grad_matches_fd(x, dx, loss, "rmsnorm dx");
  expect_grad_matches_fd(w, to_double(dw), loss, "rmsnorm dweight");
}

TEST(RMSNorm, BackwardAccumulates) {
  const int64_t N = 4, C = 5;
  auto x = to_double(randn(sz(N * C), 25)), w = to_double(randn(sz(C), 26)), dy = to_double(randn(sz(N * C), 27));
  auto dx0 = to_double(randn(sz(N * C), 28));
  auto dw0 = randn(sz(C), 29);
  std::vector<double> y(sz(N * C));
  std::vector<float> rstd(sz(N));
  cpu::rmsnorm_forward(nullptr, DType::F64, y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
  std::vector<double> dx_write(sz(N * C), 123.0), dx_acc = dx0;
  std::vector<float> dw_fresh(sz(C), 0.f), dw = dw0;
  cpu::rmsnorm_backward(nullptr, DType::F64, dx_write.data(), dw_fresh.data(), dy.data(), x.data(), w.data(),
                        rstd.data(), N, C, false);
  cpu::rmsnorm_backward(nullptr, DType::F64, dx_acc.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N,
                        C, true);
  for (size_t i = 0; i < dx0.size(); ++i) EXPECT_NEAR(dx_acc[i], dx0[i] + dx_write[i], 1e-12) << i;
  for (size_t c = 0; c < sz(C); ++c) EXPECT_NEAR(dw[c], dw0[c] + dw_fresh[c], 1e-6) << c;
}

TEST(RMSNormGpu, MatchesCpu) {
  ZP_SKIP_WITHOUT_GPU();
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1},    {3, 7},    {17, 768}, {64, 1023},
                                                           {5, 4096}, {33, 2048}, {300, 96}, {3, 12288}};
  const float eps = 1e-6f;
  uint64_t seed = 500;
  for (auto [N, C] : shapes) {
    for (DType dt : gpu_float_dtypes()) {
      for (bool acc : {false, true}) {
        seed += 10;
        const size_t NC = sz(N * C);
        auto x = round_to(randn(NC, seed, 1.f, 0.3f), dt), w = round_to(randn(sz(C), seed + 1, 0.2f, 1.f), dt);
        auto dy = round_to(randn(NC, seed + 3), dt), dx0 = round_to(randn(NC, seed + 4), dt);
        auto dw0 = randn(sz(C), seed + 5);

        std::vector<float> y(NC), rstd(sz(N)), dx = dx0, dw = dw0;
        cpu::rmsnorm_forward(nullptr, DType::F32, y.data(), rstd.data(), x.data(), w.data(), N, C, eps);
        cpu::rmsnorm_backward(nullptr, DType::F32, dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(),
                              N, C, acc);

        Tensor gx = upload(x, dt), gw = upload(w, dt), gdy = upload(dy, dt), gdx = upload(dx0, dt);
        Tensor gdw = upload(dw0, DType::F32), gy = gpu_empty(int64_t(NC), dt), grstd = gpu_empty(N, DType::F32);
        cuda::rmsnorm_forward(nullptr, dt, gy.data(), grstd.data<float>(), gx.data(), gw.data(), N, C, eps);
        cuda::rmsnorm_backward(nullptr, dt, gdx.data(), gdw.data<float>(), gdy.data(), gx.data(), gw.data(),
                               grstd.data<float>(), N, C, acc);

        std::string what = std::string(dtype_name(dt)) + " N=" + std::to_string(N) + " C=" + std::to_string(C) +
                           (acc ? " accumulate" : "");
        EXPECT_LE(rel_error(download(gy), y), tolerance(dt)) << "y " << what;
        EXPECT_LE(rel_error(download(grstd), rstd), kStatsTol) << "rstd " << what;
        EXPECT_LE(rel_error_floor(download(gdx), dx, row_grad_scale(dy, w, rstd, N, C)), tolerance(dt))
            << "dx " << what;
        EXPECT_LE(rel_error(download(gdw), dw), tolerance(dt)) << "dweight " << what;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// GroupNorm

TEST(GroupNorm, HandCheckedForward) {
  // N=1, HW=2, C=4, G=2, channels-last: pixel 0 = (1, 5, 0, 2), pixel 1 = (3, 7, 0, 2). Group 0 (channels
  // 0, 1) = {1, 5, 3, 7}: mean 4, var 5. Group 1 = {0, 2, 0, 2}: mean 1, var 1, so channel 2's xhat is -1
  // (times weight 1, plus bias 1: 0) and channel 3's is 1 (times -1, plus 0.5: -0.5).
  std::vector<float> x = {1, 5, 0, 2, 3, 7, 0, 2}, w = {1, 2, 1, -1}, b = {0, 0, 1, 0.5f}, y(8), mean(2), rstd(2);
  cpu::groupnorm_forward(nullptr, DType::F32, y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), 1, 4,
                         2, 2, 0.f, false);
  const float r0 = 1.f / std::sqrt(5.f);
  EXPECT_FLOAT_EQ(mean[0], 4.f);
  EXPECT_FLOAT_EQ(rstd[0], r0);
  EXPECT_FLOAT_EQ(mean[1], 1.f);
  EXPECT_FLOAT_EQ(rstd[1], 1.f);
  const std::vector<float> want = {-3 * r0, 2 * r0, 0.f, -0.5f, -1 * r0, 6 * r0, 0.f, -0.5f};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(y[sz(i)], want[sz(i)], 1e-6) << i;
  // Fused SiLU applies z * sigmoid(z) to the same pre-activations.
  cpu::groupnorm_forward(nullptr, DType::F32, y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), 1, 4,
                         2, 2, 0.f, true);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(y[sz(i)], silu(want[sz(i)]), 1e-6) << i;
}

TEST(GroupNorm, BackwardMatchesFiniteDifferences) {
  for (bool use_silu : {false, true}) {
    const int64_t N = 2, C = 6, HW = 5, G = 3;
    const size_t n = sz(N * C * HW);
    auto x = to_double(randn(n, 31, 1.f, 0.4f));
    auto w = to_double(randn(sz(C), 32, 0.5f, 1.f));
    auto b = to_double(randn(sz(C), 33, 0.5f));
    auto R = to_double(randn(n, 34));
    std::vector<double> y(n);
    std::vector<float> mean(sz(N * G)), rstd(sz(N * G));
    auto loss = [&] {
      cpu::groupnorm_forward(nullptr, DType::F64, y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                             C, HW, G, 1e-5f, use_silu);
      return dot(y, R);
    };
    loss();
    std::vector<double> dx(n);
    std::vector<float> dw(sz(C), 0.f), db(sz(C), 0.f);
    cpu::groupnorm_backward(nullptr, DType::F64, dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(),
                            b.data(), mean.data(), rstd.data(), N, C, HW, G, use_silu);
    const char* tag = use_silu ? " (silu)" : "";
    expect_grad_matches_fd(x, dx, loss, (std::string("groupnorm dx") + tag).c_str());
    expect_grad_matches_fd(w, to_double(dw), loss, (std::string("groupnorm dweight") + tag).c_str());
    expect_grad_matches_fd(b, to_double(db), loss, (std::string("groupnorm dbias") + tag).c_str());
  }
}

TEST(GroupNorm, ParameterGradientsAccumulate) {
  const int64_t N = 2, C = 4, HW = 3, G = 2;
  const size_t n = sz(N * C * HW);
  auto x = to_double(randn(n, 41)), w = to_double(randn(sz(C), 42)), b = to_double(randn(sz(C), 43));
  auto dy = to_double(randn(n, 44));
  auto dw0 = randn(sz(C), 45), db0 = randn(sz(C), 46);
  std::vector<double> y(n), dx(n);
  std::vector<float> mean(sz(N * G)), rstd(sz(N * G));
  cpu::groupnorm_forward(nullptr, DType::F64, y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                         HW, G, 1e-5f, true);
  std::vector<float> dw_fresh(sz(C), 0.f), db_fresh(sz(C), 0.f), dw = dw0, db = db0;
  cpu::groupnorm_backward(nullptr, DType::F64, dx.data(), dw_fresh.data(), db_fresh.data(), dy.data(), x.data(),
                          w.data(), b.data(), mean.data(), rstd.data(), N, C, HW, G, true);
  cpu::groupnorm_backward(nullptr, DType::F64, dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                          b.data(), mean.data(), rstd.data(), N, C, HW, G, true);
  for (size_t c = 0; c < sz(C); ++c) {
    EXPECT_NEAR(dw[c], dw0[c] + dw_fresh[c], 1e-6) << c;
    EXPECT_NEAR(db[c], db0[c] + db_fresh[c], 1e-6) << c;
  }
}

// The shapes include SD's widths with groups of 10-40 channels (a 16-byte pack straddles two groups),
// many row chunks a sample (64x64, 128x128), unvectorised widths (C=6, 3, 4) and a mean far from
// zero next to its spread (offset 30, where unshifted sums of squares would cancel).
TEST(GroupNormGpu, MatchesCpu) {
  ZP_SKIP_WITHOUT_GPU();
  struct Shape { int64_t N, C, HW, G; float offset; };
  const std::vector<Shape> shapes = {{2, 32, 8 * 8, 8, 0.5f},     {1, 320, 64 * 64, 32, 0.5f},
                                     {3, 6, 5 * 7, 3, 0.5f},      {2, 4, 3 * 3, 4, 0.5f},
                                     {4, 64, 16 * 16, 32, 0.5f},  {1, 3, 1, 1, 0.5f},
                                     {2, 640, 16 * 16, 32, 0.5f}, {1, 1280, 8 * 8, 32, 0.5f},
                                     {1, 96, 7 * 9, 32, 0.5f},    {2, 320, 128 * 128, 32, 0.5f},
                                     {2, 960, 32 * 32, 32, 30.f}};
  const float eps = 1e-5f;
  uint64_t seed = 900;
  for (const Shape& sh : shapes) {
    for (DType dt : gpu_float_dtypes()) {
      for (bool use_silu : {false, true}) {
        seed += 10;
        const auto [N, C, HW, G, offset] = sh;
        const size_t n = sz(N * C * HW);
        auto x = round_to(randn(n, seed, 1.f, offset), dt), w = round_to(randn(sz(C), seed + 1, 0.2f, 1.f), dt);
        auto b = round_to(randn(sz(C), seed + 2, 0.3f), dt), dy = round_to(randn(n, seed + 3), dt);
        auto dw0 = randn(sz(C), seed + 5), db0 = randn(sz(C), seed + 6);

        std::vector<float> y(n), mean(sz(N * G)), rstd(sz(N * G)), dx(n), dw = dw0, db = db0;
        cpu::groupnorm_forward(nullptr, DType::F32, y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(),
                               N, C, HW, G, eps, use_silu);
        cpu::groupnorm_backward(nullptr, DType::F32, dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                                b.data(), mean.data(), rstd.data(), N, C, HW, G, use_silu);

        Tensor gx = upload(x, dt), gw = upload(w, dt), gb = upload(b, dt), gdy = upload(dy, dt);
        Tensor gdw = upload(dw0, DType::F32), gdb = upload(db0, DType::F32);
        Tensor gy = gpu_empty(int64_t(n), dt), gdx = gpu_empty(int64_t(n), dt);
        Tensor gmean = gpu_empty(N * G, DType::F32), grstd = gpu_empty(N * G, DType::F32);
        cuda::groupnorm_forward(nullptr, dt, gy.data(), gmean.data<float>(), grstd.data<float>(), gx.data(), gw.data(),
                                gb.data(), N, C, HW, G, eps, use_silu);
        cuda::groupnorm_backward(nullptr, dt, gdx.data(), gdw.data<float>(), gdb.data<float>(), gdy.data(), gx.data(),
                                 gw.data(), gb.data(), gmean.data<float>(), grstd.data<float>(), N, C, HW, G, use_silu);

        std::string what = std::string(dtype_name(dt)) + " N=" + std::to_string(N) + " C=" + std::to_string(C) +
                           " HW=" + std::to_string(HW) + " G=" + std::to_string(G) + " offset " +
                           std::to_string(offset) + (use_silu ? " silu" : "");
        EXPECT_LE(rel_error(download(gy), y), tolerance(dt)) << "y " << what;
        EXPECT_LE(rel_error(download(gmean), mean), kStatsTol) << "mean " << what;
        EXPECT_LE(rel_error(download(grstd), rstd), kStatsTol) << "rstd " << what;
        EXPECT_LE(rel_error(download(gdx), dx), tolerance(dt)) << "dx " << what;
        EXPECT_LE(rel_error(download(gdw), dw), tolerance(dt)) << "dweight " << what;
        EXPECT_LE(rel_error(download(gdb), db), tolerance(dt)) << "dbias " << what;
      }
    }
  }
}

// Twice the same inputs, the same bits: every sum is taken in a fixed order.
TEST(GroupNormGpu, IsDeterministic) {
  ZP_SKIP_WITHOUT_GPU();
  const int64_t N = 2, C = 320, HW = 64 * 64, G = 32;
  const size_t n = sz(N * C * HW);
  Tensor gx = upload(randn(n, 7, 1.f, 0.5f), DType::BF16), gdy = upload(randn(n, 8), DType::BF16);
  Tensor gw = upload(randn(sz(C), 9, 0.2f, 1.f), DType::BF16), gb = upload(randn(sz(C), 10), DType::BF16);
  std::vector<std::vector<float>> runs;
  for (int r = 0; r < 2; ++r) {
    Tensor gy = gpu_empty(int64_t(n), DType::BF16), gdx = gpu_empty(int64_t(n), DType::BF16);
    Tensor gmean = gpu_empty(N * G, DType::F32), grstd = gpu_empty(N * G, DType::F32);
    Tensor gdw = upload(std::vector<float>(sz(C), 0.f), DType::F32), gdb = upload(std::vector<float>(sz(C), 0.f), DType::F32);
    cuda::groupnorm_forward(nullptr, DType::BF16, gy.data(), gmean.data<float>(), grstd.data<float>(), gx.data(),
                            gw.data(), gb.data(), N, C, HW, G, 1e-5f, true);
    cuda::groupnorm_backward(nullptr, DType::BF16, gdx.data(), gdw.data<float>(), gdb.data<float>(), gdy.data(),
                             gx.data(), gw.data(), gb.data(), gmean.data<float>(), grstd.data<float>(), N, C, HW, G,
                             true);
    std::vector<float> all;
    for (const Tensor* t : {&gy, &gmean, &grstd, &gdx, &gdw, &gdb}) {
      const std::vector<float> v = download(*t);
      all.insert(all.end(), v.begin(), v.end());
    }
    runs.push_back(all);
  }
  EXPECT_EQ(runs[0], runs[1]);
}

}  // namespace zp::test
