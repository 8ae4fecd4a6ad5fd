#include "kernels/elementwise.h"
#include "test_util.h"

namespace zp::test {
using namespace zp::kernels;

TEST(Elementwise, CpuAxpyScaleAdd) {
  std::vector<float> x = {1, 2, 3}, y = {10, 20, 30}, z(3);
  cpu::axpy(nullptr, DType::F32, y.data(), 2.f, x.data(), 3);
  EXPECT_EQ(y, (std::vector<float>{12, 24, 36}));
  cpu::scale(nullptr, DType::F32, z.data(), x.data(), -0.5f, 3);
  EXPECT_EQ(z, (std::vector<float>{-0.5f, -1.f, -1.5f}));
  cpu::add(nullptr, DType::F32, z.data(), x.data(), y.data(), 3);
  EXPECT_EQ(z, (std::vector<float>{13, 26, 39}));
}

TEST(Elementwise, CpuCastRoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between two bf16 values; ties go to the even mantissa (1.0).
  std::vector<float> x = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 65504.f, 1e-8f};
  std::vector<bf16> b(4);
  std::vector<f16> h(4);
  cpu::cast(nullptr, DType::BF16, b.data(), DType::F32, x.data(), 4);
  cpu::cast(nullptr, DType::F16, h.data(), DType::F32, x.data(), 4);
  EXPECT_EQ(float(b[0]), 1.0f);
  EXPECT_EQ(float(b[1]), 1.0f + 4.0f / 256);
  EXPECT_EQ(float(h[2]), 65504.f);
  EXPECT_NEAR(float(h[3]), 0.f, 6e-8f);  // below the smallest f16 subnormal / 2
}

TEST(ElementwiseGpu, MatchesCpu) {
  ZP_SKIP_WITHOUT_GPU();
  for (int64_t n : {1, 7, 1000, 100003}) {
    for (DType dt : gpu_float_dtypes()) {
      auto x = round_to(randn(size_t(n), 1 + n), dt), y = round_to(randn(size_t(n), 2 + n), dt);
      Tensor dx = upload(x, dt), dy = upload(y, dt), dz = Tensor::empty({n}, dt, Device::cuda());
      cuda::axpy(nullptr, dt, dy.data(), 0.75f, dx.data(), n);
      cuda::add(nullptr, dt, dz.data(), dx.data(), dy.data(), n);
      std::vector<float> ry = y;
      std::vector<float> rz(static_cast<size_t>(n));
      cpu::axpy(nullptr, DType::F32, ry.data(), 0.75f, x.data(), n);
      cpu::add(nullptr, DType::F32, rz.data(), x.data(), ry.data(), n);
      EXPECT_LE(rel_error(download(dz), rz), tolerance(dt)) << dtype_name(dt) << " n=" << n;
      Tensor c = Tensor::empty({n}, DType::F32, Device::cuda());
      cuda::cast(nullptr, DType::F32, c.data(), dt, dx.data(), n);
      EXPECT_EQ(download(c), x) << "cast to f32 must be exact";
    }
  }
}

}  // namespace zp::test
