// Fused cross-entropy: finite differences of the CPU reference in F64, hand-checked cases, and the
// CUDA kernels against the CPU reference (padded vocabulary, ignored rows, in place).
#include <cmath>

#include "kernels/cross_entropy.h"
#include "test_util.h"

namespace zp::test {
using namespace zp::kernels;

TEST(CrossEntropy, CpuUniformLogitsGiveLogV) {
  const int64_t N = 3, V = 10, ld = 12;
  std::vector<float> logits(size_t(N * ld), 1.5f);
  std::vector<int32_t> targets = {0, 9, -1};
  std::vector<float> loss(N), lse(N);
  cpu::cross_entropy_forward(nullptr, DType::F32, loss.data(), lse.data(), logits.data(), targets.data(), N, V, ld);
  EXPECT_NEAR(loss[0], std::log(10.0), 1e-6);
  EXPECT_NEAR(loss[1], std::log(10.0), 1e-6);
  EXPECT_NEAR(lse[0], 1.5 + std::log(10.0), 1e-6);
  EXPECT_EQ(loss[2], 0.f);  // ignored row
  // Gradient: (1/V - onehot) * scale; padding and the ignored row are zero. In place.
  cpu::cross_entropy_backward(nullptr, DType::F32, logits.data(), logits.data(), lse.data(), targets.data(), 0.5f, N,
                              V, ld);
  EXPECT_NEAR(logits[0], 0.5 * (0.1 - 1), 1e-7);
  EXPECT_NEAR(logits[1], 0.05, 1e-7);
  EXPECT_EQ(logits[10], 0.f);
  EXPECT_EQ(logits[11], 0.f);
  EXPECT_NEAR(logits[size_t(ld + 9)], 0.5 * (0.1 - 1), 1e-7);
  for (int64_t c = 0; c < ld; ++c) EXPECT_EQ(logits[size_t(2 * ld + c)], 0.f);
}

TEST(CrossEntropy, CpuBackwardMatchesFiniteDifferences) {
  const int64_t N = 6, V = 7, ld = 9;
  std::vector<int32_t> targets = {3, -1, 0, 6, -1, 2};
  const double num_valid = 4;  // dloss_scale = 1/4 is exact in float
  auto logits = to_double(randn(size_t(N * ld), 71, 2.f));
  std::vector<float> loss(N), lse(N);
  // Mean loss over the valid rows, computed in double from the F64 logits.
  auto mean_loss = [&] {
    cpu::cross_entropy_forward(nullptr, DType::F64, loss.data(), lse.data(), logits.data(), targets.data(), N, V, ld);
    // The losses are fp32; recompute in double for the finite differences.
    double total = 0;
    for (int64_t n = 0; n < N; ++n) {
      if (targets[size_t(n)] < 0) continue;
      double mx = -INFINITY, s = 0;
      for (int64_t c = 0; c < V; ++c) mx = std::max(mx, logits[size_t(n * ld + c)]);
      for (int64_t c = 0; c < V; ++c) s += std::exp(logits[size_t(n * ld + c)] - mx);
      total += mx + std::log(s) - logits[size_t(n * ld + targets[size_t(n)])];
    }
    return total / num_valid;
  };
  double l = mean_loss();
  double from_kernel = 0;
  for (float x : loss) from_kernel += x;
  EXPECT_NEAR(from_kernel / num_valid, l, 1e-5) << "the forward's losses agree with the plain formula";
  std::vector<double> grad(logits.size(), 7.0);  // garbage: every entry must be written
  cpu::cross_entropy_backward(nullptr, DType::F64, grad.data(), logits.data(), lse.data(), targets.data(),
                              float(1 / num_valid), N, V, ld);
  expect_grad_matches_fd(logits, grad, mean_loss, "cross-entropy dlogits", 1e-6, 1e-6, 1000);
}

TEST(CrossEntropyGpu, MatchesCpu) {
  ZP_SKIP_WITHOUT_GPU();
  struct Case { int64_t N, V, ld; };
  // 16-byte packs when ld allows them; ld = 1001 takes the element-by-element path.
  for (Case c : {Case{7, 50257, 50304}, Case{64, 1000, 1000}, Case{5, 999, 1001}, Case{3, 5, 8}}) {
    for (DType dt : gpu_float_dtypes()) {
      SCOPED_TRACE("N=" + std::to_string(c.N) + " V=" + std::to_string(c.V) + " ld=" + std::to_string(c.ld) + " " +
                   std::string(dtype_name(dt)));
      size_t n = size_t(c.N * c.ld);
      auto logits = round_to(randn(n, 81 + n, 3.f), dt);
      std::vector<float> targets(size_t(c.N));
      int valid = 0;
      for (int64_t i = 0; i < c.N; ++i) {
        targets[size_t(i)] = i % 3 == 1 ? -1.f : float((i * 7919) % c.V);
        valid += targets[size_t(i)] >= 0;
      }
      std::vector<int32_t> itargets(targets.begin(), targets.end());
      const float scale = 1.f / float(valid);

      std::vector<float> loss(size_t(c.N)), lse(size_t(c.N)), grad(n);
      cpu::cross_entropy_forward(nullptr, DType::F32, loss.data(), lse.data(), logits.data(), itargets.data(), c.N,
                                 c.V, c.ld);
      cpu::cross_entropy_backward(nullptr, DType::F32, grad.data(), logits.data(), nullptr, itargets.data(), scale,
                                  c.N, c.V, c.ld);

      Tensor g_logits = upload(logits, dt), g_targets = upload(targets, DType::I32);
      Tensor g_loss = Tensor::empty({c.N}, DType::F32, Device::cuda());
      Tensor g_lse = Tensor::empty({c.N}, DType::F32, Device::cuda());
      Tensor g_grad = upload(std::vector<float>(n, 9.f), dt);  // every entry must be overwritten
      auto* tg = g_targets.data<int32_t>();
      cuda::cross_entropy_forward(nullptr, dt, g_loss.data<float>(), g_lse.data<float>(), g_logits.data(), tg, c.N,
                                  c.V, c.ld);
      EXPECT_LE(rel_error(download(g_loss), loss), 1e-5) << "loss (fp32 math on identical inputs)";
      EXPECT_LE(rel_error(download(g_lse), lse), 1e-5) << "lse";
      // With the forward's lse, then recomputing it, then in place over the logits.
      cuda::cross_entropy_backward(nullptr, dt, g_grad.data(), g_logits.data(), g_lse.data<float>(), tg, scale, c.N,
                                   c.V, c.ld);
      auto with_lse = download(g_grad);
      EXPECT_LE(rel_error(with_lse, grad), tolerance(dt)) << "dlogits";
      cuda::cross_entropy_backward(nullptr, dt, g_grad.data(), g_logits.data(), nullptr, tg, scale, c.N, c.V, c.ld);
      EXPECT_LE(rel_error(download(g_grad), grad), tolerance(dt)) << "dlogits, lse recomputed";
      cuda::cross_entropy_backward(nullptr, dt, g_logits.data(), g_logits.data(), nullptr, tg, scale, c.N, c.V, c.ld);
      auto in_place = download(g_logits);
      EXPECT_LE(rel_error(in_place, grad), tolerance(dt)) << "dlogits in place";
      for (int64_t i = 0; i < c.N; ++i)
        for (int64_t col = 0; col < c.ld; ++col)
          if (itargets[size_t(i)] < 0 || col >= c.V)
            ASSERT_EQ(in_place[size_t(i * c.ld + col)], 0.f) << "row " << i << " col " << col << " must be zero";
    }
  }
}

}  // namespace zp::test
