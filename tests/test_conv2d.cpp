#include <cmath>

#include "kernels/conv2d.h"
#include "test_util.h"

namespace zp::test {
using namespace zp::kernels;

namespace {

Conv2dShape conv_shape(int64_t N, int64_t Cin, int64_t H, int64_t W, int64_t Cout, int64_t KH, int64_t KW,
                       int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  Conv2dShape c;
  c.N = N, c.Cin = Cin, c.H = H, c.W = W, c.Cout = Cout, c.KH = KH, c.KW = KW;
  c.stride_h = sh, c.stride_w = sw, c.pad_h = ph, c.pad_w = pw;
  return c;
}

std::string describe(const Conv2dShape& c) {
  return detail::cat("x[", c.N, ",", c.Cin, ",", c.H, ",", c.W, "] w[", c.Cout, ",", c.Cin, ",", c.KH, ",", c.KW,
                     "] stride ", c.stride_h, "x", c.stride_w, " pad ", c.pad_h, "x", c.pad_w);
}

// A bf16 case that tells one rounding of conv + bias from two: a 1x1 filter of ones over x0 = 1 and
// x1 = 3 * 2^-10 gives 1 + 3 * 2^-10, which bf16 alone rounds down to 1; with the bias 2^-9 the exact
// sum 1 + 5 * 2^-10 rounds up to 1 + 2^-7. Rounding the product before adding the bias gives 1.
struct BiasRoundingCase {
  Conv2dShape c = conv_shape(2, 2, 4, 4, 8, 1, 1, 1, 1, 0, 0);
  std::vector<float> x, w, b;
  const float want = 1.f + std::ldexp(1.f, -7);
  BiasRoundingCase() {
    for (int64_t n = 0; n < c.N; ++n) {
      x.insert(x.end(), size_t(c.H * c.W), 1.f);
      x.insert(x.end(), size_t(c.H * c.W), 3.f * std::ldexp(1.f, -10));
    }
    w.assign(size_t(c.w_numel()), 1.f);
    b.assign(size_t(c.Cout), std::ldexp(1.f, -9));
  }
};

}  // namespace

TEST(Conv2d, CpuBf16BiasRoundsOnce) {
  BiasRoundingCase k;
  Tensor y = Tensor::empty({k.c.y_numel()}, DType::BF16, Device::cpu());
  Tensor x = upload(k.x, DType::BF16, Device::cpu()), w = upload(k.w, DType::BF16, Device::cpu()),
         b = upload(k.b, DType::BF16, Device::cpu());
  cpu::conv2d_forward(nullptr, DType::BF16, y.data(), x.data(), w.data(), b.data(), k.c);
  for (float v : download(y)) ASSERT_EQ(v, k.want);
}

TEST(Conv2d, CpuHandChecked) {
  // x = 1..9 in a 3x3 image, w = [[1, 0], [0, -1]], bias 0.5, pad 1, stride 2 -> 2x2 output.
  // Padded input rows: 0 0 0 0 0 / 0 1 2 3 0 / 0 4 5 6 0 / 0 7 8 9 0 / 0 0 0 0 0; each output is
  // top-left - bottom-right of its window: (0-1), (0-3), (0-7), (5-9), plus the bias.
  Conv2dShape c = conv_shape(1, 1, 3, 3, 1, 2, 2, 2, 2, 1, 1);
  ASSERT_EQ(c.oh(), 2);
  ASSERT_EQ(c.ow(), 2);
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w = {1, 0, 0, -1}, b = {0.5f}, y(4);
  cpu::conv2d_forward(nullptr, DType::F32, y.data(), x.data(), w.data(), b.data(), c);
  EXPECT_EQ(y, (std::vector<float>{-0.5f, -2.5f, -6.5f, -3.5f}));

  // Backward with dy = 1: dbias = 4; dw[kh,kw] sums x over the positions tap (kh,kw) visits:
  // (0,0): x(1,1) = 5 (the rest is padding); (0,1): x(1,0)+x(1,2) = 10; (1,0): x(0,1)+x(2,1) = 10;
  // (1,1): the four corners, 1+3+7+9 = 20. dx: +1 where the top-left tap lands inside the image (only
  // (1,1)), -1 where the bottom-right tap lands (the four corners).
  std::vector<float> dy = {1, 1, 1, 1}, dw = {0, 0, 0, 0}, db = {0}, dx(9);
  cpu::conv2d_backward_filter(nullptr, DType::F32, dw.data(), db.data(), dy.data(), x.data(), c);
  EXPECT_EQ(dw, (std::vector<float>{5, 10, 10, 20}));
  EXPECT_EQ(db[0], 4.f);
  cpu::conv2d_backward_data(nullptr, DType::F32, dx.data(), dy.data(), w.data(), c);
  EXPECT_EQ(dx, (std::vector<float>{-1, 0, -1, 0, 1, 0, -1, 0, -1}));
}

TEST(Conv2d, CpuBackwardMatchesFiniteDifferences) {
  const Conv2dShape shapes[] = {
      conv_shape(2, 3, 5, 6, 4, 3, 3, 1, 1, 1, 1),  // UNet's 3x3 pad 1
      conv_shape(2, 2, 7, 6, 3, 3, 3, 2, 2, 1, 1),  // downsampling: stride 2
      conv_shape(1, 2, 7, 6, 3, 3, 2, 2, 1, 1, 0),  // rectangular kernel, mixed strides and pads
      conv_shape(2, 3, 4, 5, 2, 1, 1, 1, 1, 0, 0),  // 1x1
  };
  for (const auto& c : shapes) {
    SCOPED_TRACE(describe(c));
    auto x = to_double(randn(size_t(c.x_numel()), 1));
    auto w = to_double(randn(size_t(c.w_numel()), 2, 0.5f));
    auto b = to_double(randn(size_t(c.Cout), 3));
    auto r = to_double(randn(size_t(c.y_numel()), 4));  // loss = sum(y * r), so dy = r
    std::vector<double> y(size_t(c.y_numel()));
    auto loss = [&] {
      cpu::conv2d_forward(nullptr, DType::F64, y.data(), x.data(), w.data(), b.data(), c);
      double l = 0;
      for (size_t i = 0; i < y.size(); ++i) l += y[i] * r[i];
      return l;
    };
    std::vector<double> dx(x.size());
    std::vector<float> dw(w.size(), 0.f), db(b.size(), 0.f);
    cpu::conv2d_backward_data(nullptr, DType::F64, dx.data(), r.data(), w.data(), c);
    cpu::conv2d_backward_filter(nullptr, DType::F64, dw.data(), db.data(), r.data(), x.data(), c);
    // dw and dbias are fp32, so compare at fp32 precision.
    expect_grad_matches_fd(x, dx, loss, "dx");
    expect_grad_matches_fd(w, to_double(dw), loss, "dw", 1e-6, 1e-6);
    expect_grad_matches_fd(b, to_double(db), loss, "dbias", 1e-6, 1e-6);
  }
}

TEST(Conv2d, CpuFilterGradAccumulates) {
  Conv2dShape c = conv_shape(2, 3, 5, 5, 2, 3, 3, 2, 2, 1, 1);
  auto x = randn(size_t(c.x_numel()), 5), dy = randn(size_t(c.y_numel()), 6);
  std::vector<float> dw1(size_t(c.w_numel()), 0.f), db1(2, 0.f);
  cpu::conv2d_backward_filter(nullptr, DType::F32, dw1.data(), db1.data(), dy.data(), x.data(), c);
  std::vector<float> dw2 = dw1, db2 = db1;
  cpu::conv2d_backward_filter(nullptr, DType::F32, dw2.data(), db2.data(), dy.data(), x.data(), c);
  for (size_t i = 0; i < dw1.size(); ++i) EXPECT_FLOAT_EQ(dw2[i], 2 * dw1[i]);
  for (size_t i = 0; i < db1.size(); ++i) EXPECT_FLOAT_EQ(db2[i], 2 * db1[i]);
  // No bias gradient requested: dw still accumulates.
  cpu::conv2d_backward_filter(nullptr, DType::F32, dw2.data(), nullptr, dy.data(), x.data(), c);
  for (size_t i = 0; i < dw1.size(); ++i) EXPECT_FLOAT_EQ(dw2[i], 3 * dw1[i]);
}

TEST(Conv2dGpu, MatchesCpu) {
  ZP_SKIP_WITHOUT_GPU();
  const Conv2dShape shapes[] = {
      conv_shape(1, 3, 5, 7, 4, 3, 3, 1, 1, 1, 1),
      conv_shape(2, 8, 9, 9, 8, 3, 3, 2, 2, 1, 1),
      conv_shape(2, 5, 9, 8, 6, 3, 2, 2, 1, 1, 0),  // rectangular kernel, mixed strides and pads
      conv_shape(2, 320, 32, 32, 320, 3, 3, 1, 1, 1, 1),
      conv_shape(2, 64, 16, 16, 128, 1, 1, 1, 1, 0, 0),
  };
  uint64_t seed = 100;
  for (const auto& c : shapes) {
    for (DType dt : gpu_float_dtypes()) {
      SCOPED_TRACE(describe(c) + " " + std::string(dtype_name(dt)));
      const float wscale = 1.f / std::sqrt(float(c.Cin * c.KH * c.KW));
      auto x = round_to(randn(size_t(c.x_numel()), ++seed), dt);
      auto w = round_to(randn(size_t(c.w_numel()), ++seed, wscale), dt);
      auto b = round_to(randn(size_t(c.Cout), ++seed), dt);
      auto dy = round_to(randn(size_t(c.y_numel()), ++seed), dt);
      auto dw0 = randn(size_t(c.w_numel()), ++seed), db0 = randn(size_t(c.Cout), ++seed);  // dw, dbias accumulate

      std::vector<float> y(size_t(c.y_numel())), dx(size_t(c.x_numel())), dw = dw0, db = db0;
      cpu::conv2d_forward(nullptr, DType::F32, y.data(), x.data(), w.data(), b.data(), c);
      cpu::conv2d_backward_data(nullptr, DType::F32, dx.data(), dy.data(), w.data(), c);
      cpu::conv2d_backward_filter(nullptr, DType::F32, dw.data(), db.data(), dy.data(), x.data(), c);

      Tensor gx = upload(x, dt), gw = upload(w, dt), gb = upload(b, dt), gdy = upload(dy, dt);
      Tensor gy = Tensor::empty({c.y_numel()}, dt, Device::cuda()), gdx = Tensor::empty({c.x_numel()}, dt, Device::cuda());
      Tensor gdw = upload(dw0, DType::F32), gdb = upload(db0, DType::F32);
      cuda::conv2d_forward(nullptr, dt, gy.data(), gx.data(), gw.data(), gb.data(), c);
      cuda::conv2d_backward_data(nullptr, dt, gdx.data(), gdy.data(), gw.data(), c);
      cuda::conv2d_backward_filter(nullptr, dt, gdw.data<float>(), gdb.data<float>(), gdy.data(), gx.data(), c);

      // dw and dbias are fp32 sums over N*OH*OW products; their error relative to the (random, O(1))
      // starting values is far below the output's, so the same tolerance holds.
      EXPECT_LE(rel_error(download(gy), y), tolerance(dt)) << "y";
      EXPECT_LE(rel_error(download(gdx), dx), tolerance(dt)) << "dx";
      EXPECT_LE(rel_error(download(gdw), dw), tolerance(dt)) << "dw";
      EXPECT_LE(rel_error(download(gdb), db), tolerance(dt)) << "dbias";

      // Without bias: forward adds nothing, dbias untouched.
      const std::vector<float> gdb_before = download(gdb);
      cuda::conv2d_forward(nullptr, dt, gy.data(), gx.data(), gw.data(), nullptr, c);
      cuda::conv2d_backward_filter(nullptr, dt, gdw.data<float>(), nullptr, gdy.data(), gx.data(), c);
      std::vector<float> y_nb(y.size());
      cpu::conv2d_forward(nullptr, DType::F32, y_nb.data(), x.data(), w.data(), nullptr, c);
      EXPECT_LE(rel_error(download(gy), y_nb), tolerance(dt)) << "y without bias";
      EXPECT_EQ(download(gdb), gdb_before) << "dbias must be untouched";
      std::vector<float> dw_twice = dw;
      for (size_t i = 0; i < dw.size(); ++i) dw_twice[i] = 2 * dw[i] - dw0[i];
      EXPECT_LE(rel_error(download(gdw), dw_twice), tolerance(dt)) << "dw accumulated twice";
    }
  }
}

TEST(Conv2dGpu, Bf16BiasRoundsOnce) {
  ZP_SKIP_WITHOUT_GPU();
  BiasRoundingCase k;
  Tensor y = Tensor::empty({k.c.y_numel()}, DType::BF16, Device::cuda());
  Tensor x = upload(k.x, DType::BF16), w = upload(k.w, DType::BF16), b = upload(k.b, DType::BF16);
  cuda::conv2d_forward(nullptr, DType::BF16, y.data(), x.data(), w.data(), b.data(), k.c);
  for (float v : download(y)) ASSERT_EQ(v, k.want) << "conv + bias rounded twice?";
}

}  // namespace zp::test
