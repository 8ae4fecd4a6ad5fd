#include <cmath>

#include "kernels/activation.h"
#include "test_util.h"

namespace zp::test {
using namespace zp::kernels;

namespace {

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// A device buffer holding v at an element offset (offset 1 misaligns it, forcing the scalar path).
struct DevBuf {
  Tensor t;
  size_t offset = 0;
  DType dt;
  DevBuf(const std::vector<float>& v, DType d, size_t off = 0) : offset(off), dt(d) {
    std::vector<float> padded(off, 0.f);
    padded.insert(padded.end(), v.begin(), v.end());
    t = upload(padded, d);
  }
  void* ptr() const { return static_cast<char*>(t.data()) + offset * dtype_size(dt); }
  std::vector<float> get() const {
    auto v = download(t);
    return {v.begin() + long(offset), v.end()};
  }
};

}  // namespace

TEST(Activation, CpuHandValues) {
  std::vector<double> x = {1.0, -1.0, 0.0}, y(3);
  cpu::gelu_forward(nullptr, DType::F64, y.data(), x.data(), 3, GeluKind::Tanh);
  EXPECT_NEAR(y[0], 0.8411920, 1e-7);
  EXPECT_NEAR(y[1], 0.8411920 - 1.0, 1e-7);  // gelu(-x) = gelu(x) - x
  EXPECT_EQ(y[2], 0.0);
  cpu::gelu_forward(nullptr, DType::F64, y.data(), x.data(), 3, GeluKind::Erf);
  EXPECT_NEAR(y[0], 0.8413447, 1e-7);
  cpu::silu_forward(nullptr, DType::F64, y.data(), x.data(), 3);
  EXPECT_NEAR(y[0], 0.7310585786, 1e-9);
  EXPECT_NEAR(y[1], -0.2689414214, 1e-9);

  // Packed SwiGLU: first half = gate, second = up. Packed GEGLU: first half = hidden, second = gate.
  std::vector<float> packed = {1.f, 2.f}, out(1);
  cpu::swiglu_forward_packed(nullptr, DType::F32, out.data(), packed.data(), 1, 1);
  EXPECT_NEAR(out[0], 0.7310585786 * 2.0, 1e-6);
  cpu::geglu_forward_packed(nullptr, DType::F32, out.data(), packed.data(), 1, 1);
  EXPECT_NEAR(out[0], 1.0 * 1.9544997361, 1e-6);  // hidden * gelu_erf(2), gelu_erf(2) = 2 Phi(2)
  // Large arguments stay finite.
  std::vector<float> big = {-100.f, 100.f}, by(2);
  cpu::silu_forward(nullptr, DType::F32, by.data(), big.data(), 2);
  EXPECT_NEAR(by[0], 0.f, 1e-30f);
  EXPECT_EQ(by[1], 100.f);
}

TEST(Activation, CpuGeluSiluBackwardMatchFiniteDifferences) {
  const int64_t n = 41;
  auto x = to_double(randn(static_cast<size_t>(n), 11, 2.f));
  auto w = to_double(randn(static_cast<size_t>(n), 12));
  std::vector<double> y(static_cast<size_t>(n)), dx(static_cast<size_t>(n));
  for (GeluKind kind : {GeluKind::Tanh, GeluKind::Erf}) {
    auto loss = [&] {
      cpu::gelu_forward(nullptr, DType::F64, y.data(), x.data(), n, kind);
      return dot(y, w);
    };
    cpu::gelu_backward(nullptr, DType::F64, dx.data(), w.data(), x.data(), n, kind);
    expect_grad_matches_fd(x, dx, loss, kind == GeluKind::Tanh ? "gelu tanh" : "gelu erf");
  }
  auto loss = [&] {
    cpu::silu_forward(nullptr, DType::F64, y.data(), x.data(), n);
    return dot(y, w);
  };
  cpu::silu_backward(nullptr, DType::F64, dx.data(), w.data(), x.data(), n);
  expect_grad_matches_fd(x, dx, loss, "silu");
  // In place: dx may alias dy.
  std::vector<double> inplace = w;
  cpu::silu_backward(nullptr, DType::F64, inplace.data(), inplace.data(), x.data(), n);
  EXPECT_EQ(inplace, dx);
}

TEST(Activation, CpuSwigluBackwardMatchesFiniteDifferences) {
  const int64_t n = 37;
  auto gate = to_double(randn(static_cast<size_t>(n), 21, 2.f)), up = to_double(randn(static_cast<size_t>(n), 22));
  auto w = to_double(randn(static_cast<size_t>(n), 23));
  std::vector<double> y(static_cast<size_t>(n)), dgate(static_cast<size_t>(n)), dup(static_cast<size_t>(n));
  auto loss = [&] {
    cpu::swiglu_forward(nullptr, DType::F64, y.data(), gate.data(), up.data(), n);
    return dot(y, w);
  };
  cpu::swiglu_backward(nullptr, DType::F64, dgate.data(), dup.data(), w.data(), gate.data(), up.data(), n);
  expect_grad_matches_fd(gate, dgate, loss, "swiglu dgate");
  expect_grad_matches_fd(up, dup, loss, "swiglu dup");
}

TEST(Activation, CpuPackedGatedBackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, D = 5;
  auto x = to_double(randn(static_cast<size_t>(rows * 2 * D), 31, 2.f));
  auto w = to_double(randn(static_cast<size_t>(rows * D), 32));
  std::vector<double> y(static_cast<size_t>(rows * D)), dx(static_cast<size_t>(rows * 2 * D));
  auto swiglu_loss = [&] {
    cpu::swiglu_forward_packed(nullptr, DType::F64, y.data(), x.data(), rows, D);
    return dot(y, w);
  };
  cpu::swiglu_backward_packed(nullptr, DType::F64, dx.data(), w.data(), x.data(), rows, D);
  expect_grad_matches_fd(x, dx, swiglu_loss, "swiglu packed");
  auto geglu_loss = [&] {
    cpu::geglu_forward_packed(nullptr, DType::F64, y.data(), x.data(), rows, D);
    return dot(y, w);
  };
  cpu::geglu_backward_packed(nullptr, DType::F64, dx.data(), w.data(), x.data(), rows, D);
  expect_grad_matches_fd(x, dx, geglu_loss, "geglu packed");
  // In place: dx may alias x.
  std::vector<double> inplace = x;
  cpu::geglu_backward_packed(nullptr, DType::F64, inplace.data(), w.data(), inplace.data(), rows, D);
  EXPECT_EQ(inplace, dx);
}

TEST(Activation, CpuPackedSwigluMatchesSeparateHalves) {
  const int64_t rows = 4, D = 6;
  auto x = to_double(randn(static_cast<size_t>(rows * 2 * D), 41));
  auto dy = to_double(randn(static_cast<size_t>(rows * D), 42));
  std::vector<double> gate, up;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < 2 * D; ++c) (c < D ? gate : up).push_back(x[static_cast<size_t>(r * 2 * D + c)]);
  std::vector<double> y1(static_cast<size_t>(rows * D)), y2(static_cast<size_t>(rows * D)), dx(static_cast<size_t>(rows * 2 * D)), dg(y1.size()), du(y1.size());
  cpu::swiglu_forward_packed(nullptr, DType::F64, y1.data(), x.data(), rows, D);
  cpu::swiglu_forward(nullptr, DType::F64, y2.data(), gate.data(), up.data(), rows * D);
  EXPECT_EQ(y1, y2);
  cpu::swiglu_backward_packed(nullptr, DType::F64, dx.data(), dy.data(), x.data(), rows, D);
  cpu::swiglu_backward(nullptr, DType::F64, dg.data(), du.data(), dy.data(), gate.data(), up.data(), rows * D);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < D; ++c) {
      EXPECT_EQ(dx[static_cast<size_t>(r * 2 * D + c)], dg[static_cast<size_t>(r * D + c)]);
      EXPECT_EQ(dx[static_cast<size_t>(r * 2 * D + D + c)], du[static_cast<size_t>(r * D + c)]);
    }
}

TEST(ActivationGpu, PointwiseMatchCpu) {
  ZP_SKIP_WITHOUT_GPU();
  for (int64_t n : {1, 7, 1000, 1000003}) {
    for (size_t off : {0, 1}) {
      for (DType dt : gpu_float_dtypes()) {
        auto x = round_to(randn(static_cast<size_t>(n), 100 + n, 2.f), dt);
        auto up = round_to(randn(static_cast<size_t>(n), 200 + n), dt);
        auto dy = round_to(randn(static_cast<size_t>(n), 300 + n), dt);
        DevBuf gx(x, dt, off), gup(up, dt, off), gdy(dy, dt, off), gout(std::vector<float>(static_cast<size_t>(n)), dt, off),
            gout2(std::vector<float>(static_cast<size_t>(n)), dt, off);
        std::vector<float> ref(static_cast<size_t>(n)), ref2(static_cast<size_t>(n));
        auto expect_close = [&](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
          EXPECT_LE(rel_error(got, want), tolerance(dt)) << what << " " << dtype_name(dt) << " n=" << n << " off=" << off;
        };
        for (GeluKind kind : {GeluKind::Tanh, GeluKind::Erf}) {
          cuda::gelu_forward(nullptr, dt, gout.ptr(), gx.ptr(), n, kind);
          cpu::gelu_forward(nullptr, DType::F32, ref.data(), x.data(), n, kind);
          expect_close(gout.get(), ref, "gelu_forward");
          cuda::gelu_backward(nullptr, dt, gout.ptr(), gdy.ptr(), gx.ptr(), n, kind);
          cpu::gelu_backward(nullptr, DType::F32, ref.data(), dy.data(), x.data(), n, kind);
          expect_close(gout.get(), ref, "gelu_backward");
        }
        cuda::silu_forward(nullptr, dt, gout.ptr(), gx.ptr(), n);
        cpu::silu_forward(nullptr, DType::F32, ref.data(), x.data(), n);
        expect_close(gout.get(), ref, "silu_forward");
        cuda::silu_backward(nullptr, dt, gout.ptr(), gdy.ptr(), gx.ptr(), n);
        cpu::silu_backward(nullptr, DType::F32, ref.data(), dy.data(), x.data(), n);
        expect_close(gout.get(), ref, "silu_backward");
        cuda::swiglu_forward(nullptr, dt, gout.ptr(), gx.ptr(), gup.ptr(), n);
        cpu::swiglu_forward(nullptr, DType::F32, ref.data(), x.data(), up.data(), n);
        expect_close(gout.get(), ref, "swiglu_forward");
        cuda::swiglu_backward(nullptr, dt, gout.ptr(), gout2.ptr(), gdy.ptr(), gx.ptr(), gup.ptr(), n);
        cpu::swiglu_backward(nullptr, DType::F32, ref.data(), ref2.data(), dy.data(), x.data(), up.data(), n);
        expect_close(gout.get(), ref, "swiglu_backward dgate");
        expect_close(gout2.get(), ref2, "swiglu_backward dup");
        // In place: y over x.
        cuda::silu_forward(nullptr, dt, gx.ptr(), gx.ptr(), n);
        cpu::silu_forward(nullptr, DType::F32, ref.data(), x.data(), n);
        expect_close(gx.get(), ref, "silu_forward in place");
      }
    }
  }
}

TEST(ActivationGpu, PackedGatedMatchCpu) {
  ZP_SKIP_WITHOUT_GPU();
  struct Case { int64_t rows, D; size_t off; };
  for (Case sh : {Case{3, 5, 0}, Case{1, 1, 0}, Case{4, 64, 0}, Case{4, 64, 1}, Case{7, 24, 0}, Case{33, 1000, 0}}) {
    const int64_t rows = sh.rows, D = sh.D;
    for (DType dt : gpu_float_dtypes()) {
      auto x = round_to(randn(static_cast<size_t>(rows * 2 * D), 400 + D, 2.f), dt);
      auto dy = round_to(randn(static_cast<size_t>(rows * D), 500 + D), dt);
      DevBuf gx(x, dt, sh.off), gdy(dy, dt, sh.off), gy(std::vector<float>(static_cast<size_t>(rows * D)), dt, sh.off),
          gdx(std::vector<float>(static_cast<size_t>(rows * 2 * D)), dt, sh.off);
      std::vector<float> y(static_cast<size_t>(rows * D)), dx(static_cast<size_t>(rows * 2 * D));
      auto expect_close = [&](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
        EXPECT_LE(rel_error(got, want), tolerance(dt))
            << what << " " << dtype_name(dt) << " rows=" << rows << " D=" << D << " off=" << sh.off;
      };
      cuda::swiglu_forward_packed(nullptr, dt, gy.ptr(), gx.ptr(), rows, D);
      cpu::swiglu_forward_packed(nullptr, DType::F32, y.data(), x.data(), rows, D);
      expect_close(gy.get(), y, "swiglu_forward_packed");
      cuda::swiglu_backward_packed(nullptr, dt, gdx.ptr(), gdy.ptr(), gx.ptr(), rows, D);
      cpu::swiglu_backward_packed(nullptr, DType::F32, dx.data(), dy.data(), x.data(), rows, D);
      expect_close(gdx.get(), dx, "swiglu_backward_packed");
      cuda::geglu_forward_packed(nullptr, dt, gy.ptr(), gx.ptr(), rows, D);
      cpu::geglu_forward_packed(nullptr, DType::F32, y.data(), x.data(), rows, D);
      expect_close(gy.get(), y, "geglu_forward_packed");
      cuda::geglu_backward_packed(nullptr, dt, gdx.ptr(), gdy.ptr(), gx.ptr(), rows, D);
      cpu::geglu_backward_packed(nullptr, DType::F32, dx.data(), dy.data(), x.data(), rows, D);
      expect_close(gdx.get(), dx, "geglu_backward_packed");
      // In place: dx over x.
      cuda::geglu_backward_packed(nullptr, dt, gx.ptr(), gdy.ptr(), gx.ptr(), rows, D);
      expect_close(gx.get(), dx, "geglu_backward_packed in place");
    }
  }
}

}  // namespace zp::test
