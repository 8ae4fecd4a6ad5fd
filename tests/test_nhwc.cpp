// Channels-last layout ops: hand-checked CPU cases, adjoint identities (each op's backward is the
// adjoint of its forward), and CUDA against the CPU reference.
#include "kernels/nhwc.h"
#include "test_util.h"

namespace zp::test {
using namespace zp::kernels;

TEST(Nhwc, TransposeByHand) {
  // two batches of [2, 3]
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, y(12);
  cpu::transpose_batched(nullptr, DType::F32, y.data(), x.data(), 2, 2, 3);
  EXPECT_EQ(y, (std::vector<float>{1, 4, 2, 5, 3, 6, 7, 10, 8, 11, 9, 12}));
  std::vector<float> back(12);
  cpu::transpose_batched(nullptr, DType::F32, back.data(), y.data(), 2, 3, 2);
  EXPECT_EQ(back, x);
}

TEST(Nhwc, ChannelAddAndSumByHand) {
  // N=2, C=2, HW=3: each pixel's two channels get the sample's (1, 2), then (3, 4)
  std::vector<float> y(12, 1.f), shift = {1, 2, 3, 4}, sum(4);
  cpu::channel_add(nullptr, DType::F32, y.data(), shift.data(), 2, 2, 3);
  EXPECT_EQ(y, (std::vector<float>{2, 3, 2, 3, 2, 3, 4, 5, 4, 5, 4, 5}));
  cpu::channel_sum(nullptr, DType::F32, sum.data(), y.data(), 2, 2, 3);
  EXPECT_EQ(sum, (std::vector<float>{6, 9, 12, 15}));
}

// <channel_add(0, s), g> = <s, channel_sum(g)>: the sum is the shift's gradient.
TEST(Nhwc, ChannelSumIsTheAdjointOfChannelAdd) {
  const int64_t N = 3, C = 5, HW = 7;
  auto s = randn(size_t(N * C), 1), g = randn(size_t(N * C * HW), 2);
  std::vector<double> y(size_t(N * C * HW), 0.0), sd(s.begin(), s.end()), gd(g.begin(), g.end()), sum(size_t(N * C));
  cpu::channel_add(nullptr, DType::F64, y.data(), sd.data(), N, C, HW);
  cpu::channel_sum(nullptr, DType::F64, sum.data(), gd.data(), N, C, HW);
  double lhs = 0, rhs = 0;
  for (size_t i = 0; i < y.size(); ++i) lhs += y[i] * gd[i];
  for (size_t i = 0; i < sum.size(); ++i) rhs += sd[i] * sum[i];
  EXPECT_NEAR(lhs, rhs, 1e-9 * std::abs(rhs) + 1e-12);
}

TEST(NhwcGpu, MatchesCpu) {
  ZP_SKIP_WITHOUT_GPU();
  struct Case { int64_t B, P, Q; };
  for (DType dt : gpu_float_dtypes())
    for (Case k : {Case{1, 1, 1}, Case{2, 16, 64}, Case{3, 33, 65}, Case{2, 320, 1024}, Case{1, 7, 4097}}) {
      const size_t n = size_t(k.B * k.P * k.Q);
      auto x = round_to(randn(n, 10 + n), dt);
      // transpose
      std::vector<float> want(n);
      std::vector<double> xd(x.begin(), x.end()), yd(n);
      cpu::transpose_batched(nullptr, DType::F64, yd.data(), xd.data(), k.B, k.P, k.Q);
      for (size_t i = 0; i < n; ++i) want[i] = float(yd[i]);
      Tensor gx = upload(x, dt), gy = Tensor::empty({int64_t(n)}, dt, Device::cuda(0));
      cuda::transpose_batched(nullptr, dt, gy.data(), gx.data(), k.B, k.P, k.Q);
      EXPECT_EQ(rel_error(download(gy), want), 0.0) << "transpose " << dtype_name(dt) << " " << k.B << "x" << k.P
                                                    << "x" << k.Q;
      // channel_add / channel_sum with N = B, C = P, HW = Q
      auto shift = round_to(randn(size_t(k.B * k.P), 20 + n), dt);
      std::vector<double> sd(shift.begin(), shift.end()), added = xd, sums(size_t(k.B * k.P));
      cpu::channel_add(nullptr, DType::F64, added.data(), sd.data(), k.B, k.P, k.Q);
      cpu::channel_sum(nullptr, DType::F64, sums.data(), xd.data(), k.B, k.P, k.Q);
      Tensor gs = upload(shift, dt), gsum = Tensor::empty({k.B * k.P}, dt, Device::cuda(0));
      cuda::channel_sum(nullptr, dt, gsum.data(), gx.data(), k.B, k.P, k.Q);
      cuda::channel_add(nullptr, dt, gx.data(), gs.data(), k.B, k.P, k.Q);
      EXPECT_LE(rel_error(download(gx), added), tolerance(dt)) << "channel_add " << dtype_name(dt);
      EXPECT_LE(rel_error(download(gsum), sums), tolerance(dt)) << "channel_sum " << dtype_name(dt);
    }
}

}  // namespace zp::test
