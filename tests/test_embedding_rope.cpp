// Embedding, RoPE and nearest-2x upsampling: the ops that move values by index or position.
#include <cmath>

#include "kernels/embedding.h"
#include "kernels/rope.h"
#include "kernels/upsample.h"
#include "packed_segments.h"
#include "test_util.h"

namespace zp::test {
using namespace zp::kernels;

namespace {

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

std::vector<double> minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<double> r(a.size());
  for (size_t i = 0; i < a.size(); ++i) r[i] = double(a[i]) - double(b[i]);
  return r;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Embedding

TEST(Embedding, CpuHandValues) {
  const int64_t V = 4, C = 2, T = 2;
  std::vector<float> table = {0, 1, 10, 11, 20, 21, 30, 31};
  std::vector<float> pos = {100, 200, 300, 400, 500, 600};  // Tmax = 3
  std::vector<int32_t> ids = {2, 0, 3, 2};                  // B = 2, T = 2
  std::vector<float> y(8);
  cpu::embedding_forward(nullptr, DType::F32, y.data(), ids.data(), table.data(), 4, C, V, nullptr, 0, 0);
  EXPECT_EQ(y, (std::vector<float>{20, 21, 0, 1, 30, 31, 20, 21}));
  cpu::embedding_forward(nullptr, DType::F32, y.data(), ids.data(), table.data(), 4, C, V, pos.data(), T, 0);
  EXPECT_EQ(y, (std::vector<float>{120, 221, 300, 401, 130, 231, 320, 421}));
  // Generation: one new token per sequence at position 2.
  cpu::embedding_forward(nullptr, DType::F32, y.data(), ids.data(), table.data(), 2, C, V, pos.data(), 1, 2);
  EXPECT_EQ(std::vector<float>(y.begin(), y.begin() + 4), (std::vector<float>{520, 621, 500, 601}));

  // Backward accumulates: token 2 appears twice.
  std::vector<float> dy = {1, 2, 3, 4, 5, 6, 7, 8}, dtable(8, 1.f), dpos(6, 0.f);
  cpu::embedding_backward(nullptr, DType::F32, dtable.data(), dpos.data(), dy.data(), ids.data(), 4, C, V, T, 0);
  EXPECT_EQ(dtable, (std::vector<float>{4, 5, 1, 1, 9, 11, 6, 7}));
  EXPECT_EQ(dpos, (std::vector<float>{6, 8, 10, 12, 0, 0}));
}

TEST(Embedding, CpuRejectsIdsOutOfRange) {
  std::vector<float> table(6), y(4);
  std::vector<int32_t> bad_high = {0, 3}, bad_low = {-1, 0};
  EXPECT_DEATH(cpu::embedding_forward(nullptr, DType::F32, y.data(), bad_high.data(), table.data(), 2, 2, 3, nullptr,
                                      0, 0),
               "token id 3 at row 1");
  EXPECT_DEATH(cpu::embedding_backward(nullptr, DType::F32, table.data(), nullptr, y.data(), bad_low.data(), 2, 2, 3,
                                       0, 0),
               "token id -1 at row 0");
}

TEST(Embedding, CpuBackwardMatchesFiniteDifferences) {
  const int64_t V = 11, C = 5, B = 3, T = 4, N = B * T, Tmax = 9, pos_offset = 2;
  auto table = to_double(randn(static_cast<size_t>(V * C), 1));
  auto pos = to_double(randn(static_cast<size_t>(Tmax * C), 2));
  auto w = to_double(randn(static_cast<size_t>(N * C), 3));
  std::vector<int32_t> ids(static_cast<size_t>(N));
  for (int64_t r = 0; r < N; ++r) ids[static_cast<size_t>(r)] = int32_t(r == 3 ? V - 1 : (r * 7) % 5);  // repeats, and V-1
  std::vector<double> y(static_cast<size_t>(N * C));
  auto loss = [&] {
    cpu::embedding_forward(nullptr, DType::F64, y.data(), ids.data(), table.data(), N, C, V, pos.data(), T,
                           pos_offset);
    return dot(y, w);
  };
  auto init_t = randn(static_cast<size_t>(V * C), 4), init_p = randn(static_cast<size_t>(Tmax * C), 5);
  std::vector<float> dtable = init_t, dpos = init_p;
  cpu::embedding_backward(nullptr, DType::F64, dtable.data(), dpos.data(), w.data(), ids.data(), N, C, V, T,
                          pos_offset);
  expect_grad_matches_fd(table, minus(dtable, init_t), loss, "dtable", 1e-6, 1e-6, 1000);
  expect_grad_matches_fd(pos, minus(dpos, init_p), loss, "dpos_table", 1e-6, 1e-6, 1000);
}

TEST(EmbeddingGpu, MatchesCpu) {
  ZP_SKIP_WITHOUT_GPU();
  struct Case { int64_t V, C, B, T, pos_offset; bool positions; };
  for (Case k : {Case{50257, 7, 3, 5, 0, true}, Case{50257, 7, 2, 9, 0, false}, Case{1000, 64, 4, 33, 3, true},
                 Case{97, 768, 2, 64, 0, true}}) {
    const int64_t N = k.B * k.T, Tmax = k.T + k.pos_offset;
    std::vector<float> ids(static_cast<size_t>(N));
    for (int64_t r = 0; r < N; ++r)  // repeats (atomics collide), the last id and 0
      ids[static_cast<size_t>(r)] = float(r % 3 == 0 ? (r * 7919) % k.V : r % 5 == 1 ? k.V - 1 : r % 4);
    std::vector<int32_t> ids_host(ids.begin(), ids.end());
    Tensor gids = upload(ids, DType::I32);
    for (DType dt : gpu_float_dtypes()) {
      auto table = round_to(randn(static_cast<size_t>(k.V * k.C), 10 + k.C), dt);
      auto pos = round_to(randn(static_cast<size_t>(Tmax * k.C), 20 + k.C), dt);
      auto dy = round_to(randn(static_cast<size_t>(N * k.C), 30 + k.C), dt);
      auto init_t = randn(static_cast<size_t>(k.V * k.C), 40), init_p = randn(static_cast<size_t>(Tmax * k.C), 50);
      Tensor gt = upload(table, dt), gp = upload(pos, dt), gdy = upload(dy, dt);
      Tensor gy = Tensor::empty({N * k.C}, dt, Device::cuda());
      Tensor gdt = upload(init_t, DType::F32), gdp = upload(init_p, DType::F32);
      const void* pos_ptr = k.positions ? gp.data() : nullptr;
      cuda::embedding_forward(nullptr, dt, gy.data(), gids.data<int32_t>(), gt.data(), N, k.C, k.V, pos_ptr, k.T,
                              k.pos_offset);
      cuda::embedding_backward(nullptr, dt, gdt.data<float>(), k.positions ? gdp.data<float>() : nullptr,
                               gdy.data(), gids.data<int32_t>(), N, k.C, k.V, k.T, k.pos_offset);
      std::vector<float> y(static_cast<size_t>(N * k.C)), dtable = init_t, dpos = init_p;
      cpu::embedding_forward(nullptr, DType::F32, y.data(), ids_host.data(), table.data(), N, k.C, k.V,
                             k.positions ? pos.data() : nullptr, k.T, k.pos_offset);
      cpu::embedding_backward(nullptr, DType::F32, dtable.data(), k.positions ? dpos.data() : nullptr, dy.data(),
                              ids_host.data(), N, k.C, k.V, k.T, k.pos_offset);
      std::string what = std::string(dtype_name(dt)) + " V=" + std::to_string(k.V) + " C=" + std::to_string(k.C);
      EXPECT_LE(rel_error(download(gy), y), tolerance(dt)) << "forward " << what;
      // The gradients are fp32 sums of the same (already rounded) dy values: fp32 tolerance.
      EXPECT_LE(rel_error(minus(download(gdt), init_t), minus(dtable, init_t)), tolerance(DType::F32)) << "dtable " << what;
      EXPECT_LE(rel_error(minus(download(gdp), init_p), minus(dpos, init_p)), tolerance(DType::F32)) << "dpos " << what;
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// RoPE

TEST(Rope, CpuKnownVectorAtPositionOne) {
  // D = 4, theta = 1e4: inv_freq = {1, 1/100}; pairs (0, 2) and (1, 3) rotate by 1 and 0.01 rad.
  // cos and sin are rounded to float (as HF computes them), hence the 5e-7 tolerance.
  std::vector<double> x = {1, 2, 3, 4}, y(4);
  cpu::rope_forward(nullptr, DType::F64, y.data(), x.data(), 1, 1, 1, 4, 10000.f, 1);
  EXPECT_NEAR(y[0], 1 * std::cos(1.0) - 3 * std::sin(1.0), 5e-7);  // -1.98411065
  EXPECT_NEAR(y[1], 1.9599006675, 5e-7);
  EXPECT_NEAR(y[2], 2.4623779024, 5e-7);
  EXPECT_NEAR(y[3], 4.0197996683, 5e-7);
  // Position 0 is the identity.
  cpu::rope_forward(nullptr, DType::F64, y.data(), x.data(), 1, 1, 1, 4, 10000.f, 0);
  EXPECT_EQ(y, x);
}

TEST(Rope, CpuBackwardMatchesFiniteDifferencesAndInvertsForward) {
  const int64_t B = 2, T = 5, H = 3, D = 8;
  const size_t n = static_cast<size_t>(B * T * H * D);
  for (float theta : {10000.f, 1e6f}) {
    auto x = to_double(randn(n, 61)), w = to_double(randn(n, 62));
    std::vector<double> y(n), dx(n);
    auto loss = [&] {
      cpu::rope_forward(nullptr, DType::F64, y.data(), x.data(), B, T, H, D, theta, 3);
      return dot(y, w);
    };
    cpu::rope_backward(nullptr, DType::F64, dx.data(), w.data(), B, T, H, D, theta, 3);
    expect_grad_matches_fd(x, dx, loss, "rope", 1e-6, 1e-6, 1000);
    // Backward undoes forward (in place both ways), up to cos^2 + sin^2 = 1 with float cos and sin.
    std::vector<double> z = x;
    cpu::rope_forward(nullptr, DType::F64, z.data(), z.data(), B, T, H, D, theta, 3);
    cpu::rope_backward(nullptr, DType::F64, z.data(), z.data(), B, T, H, D, theta, 3);
    EXPECT_LE(rel_error(z, x), 1e-7);
  }
}

TEST(Rope, CpuPositionOffsetContinuesTheSequence) {
  // Rows t = 4..6 of a 7-token sequence equal a 3-token call with pos_offset 4.
  const int64_t H = 2, D = 6;
  auto x = to_double(randn(static_cast<size_t>(7 * H * D), 71));
  std::vector<double> full(x.size()), tail(static_cast<size_t>(3 * H * D));
  cpu::rope_forward(nullptr, DType::F64, full.data(), x.data(), 1, 7, H, D, 10000.f, 0);
  cpu::rope_forward(nullptr, DType::F64, tail.data(), x.data() + 4 * H * D, 1, 3, H, D, 10000.f, 4);
  EXPECT_EQ(tail, std::vector<double>(full.begin() + 4 * H * D, full.end()));
}

TEST(RopeGpu, MatchesCpu) {
  ZP_SKIP_WITHOUT_GPU();
  struct Case { int64_t B, T, H, D; float theta; int64_t pos_offset; };
  for (Case k : {Case{2, 5, 3, 8, 1e4f, 0}, Case{2, 5, 3, 64, 1e4f, 0}, Case{2, 5, 3, 64, 1e6f, 7},
                 Case{1, 300, 4, 128, 1e6f, 2000}, Case{3, 1, 2, 2, 1e4f, 5}}) {
    const int64_t n = k.B * k.T * k.H * k.D;
    for (DType dt : gpu_float_dtypes()) {
      auto x = round_to(randn(static_cast<size_t>(n), 80 + k.D), dt), dy = round_to(randn(static_cast<size_t>(n), 90 + k.D), dt);
      Tensor gx = upload(x, dt), gdy = upload(dy, dt), gy = Tensor::empty({n}, dt, Device::cuda());
      std::vector<float> y(static_cast<size_t>(n)), dx(static_cast<size_t>(n));
      std::string what = std::string(dtype_name(dt)) + " D=" + std::to_string(k.D) + " T=" + std::to_string(k.T);
      cuda::rope_forward(nullptr, dt, gy.data(), gx.data(), k.B, k.T, k.H, k.D, k.theta, k.pos_offset);
      cpu::rope_forward(nullptr, DType::F32, y.data(), x.data(), k.B, k.T, k.H, k.D, k.theta, k.pos_offset);
      EXPECT_LE(rel_error(download(gy), y), tolerance(dt)) << "forward " << what;
      cuda::rope_backward(nullptr, dt, gdy.data(), gdy.data(), k.B, k.T, k.H, k.D, k.theta, k.pos_offset);  // in place
      cpu::rope_backward(nullptr, DType::F32, dx.data(), dy.data(), k.B, k.T, k.H, k.D, k.theta, k.pos_offset);
      EXPECT_LE(rel_error(download(gdy), dx), tolerance(dt)) << "backward " << what;
    }
  }
}

// A packed [q | k | v] row: rotating the first Hr heads with a row stride equals rotating a dense copy
// of them, and leaves the rest of the row untouched.
static void check_rope_row_stride(Device dev, DType dt) {
  const int64_t B = 2, T = 5, Hr = 3, Hv = 2, D = 8, W = (Hr + Hv) * D;
  auto packed = round_to(randn(size_t(B * T * W), 321), dt);
  std::vector<float> dense(size_t(B * T * Hr * D)), ref(dense.size());
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t j = 0; j < Hr * D; ++j) dense[size_t(r * Hr * D + j)] = packed[size_t(r * W + j)];
  cpu::rope_forward(nullptr, DType::F32, ref.data(), dense.data(), B, T, Hr, D, 1e4f, 2);
  std::vector<float> out;
  if (dev.is_cpu()) {
    out = packed;
    cpu::rope_forward(nullptr, DType::F32, out.data(), out.data(), B, T, Hr, D, 1e4f, 2, W);
  } else {
    Tensor g = upload(packed, dt);
    cuda::rope_forward(nullptr, dt, g.data(), g.data(), B, T, Hr, D, 1e4f, 2, W);
    out = download(g);
  }
  std::vector<float> got(dense.size());
  for (int64_t r = 0; r < B * T; ++r) {
    for (int64_t j = 0; j < Hr * D; ++j) got[size_t(r * Hr * D + j)] = out[size_t(r * W + j)];
    for (int64_t j = Hr * D; j < W; ++j) EXPECT_EQ(out[size_t(r * W + j)], packed[size_t(r * W + j)]) << "v head touched";
  }
  EXPECT_LE(rel_error(got, ref), tolerance(dt)) << dtype_name(dt);
}

TEST(Rope, RowStrideRotatesOnlyTheNamedHeads) { check_rope_row_stride(Device::cpu(), DType::F32); }

TEST(RopeGpu, RowStride) {
  ZP_SKIP_WITHOUT_GPU();
  for (DType dt : gpu_float_dtypes()) check_rope_row_stride(Device::cuda(), dt);
}

// Packed sequences: with positions that restart at 0 in each segment, rotating a packed [q | k | v] row
// (row stride, in place) equals rotating each segment's rows on their own with offset 0, forward and
// backward, and leaves the v heads untouched. On the CPU in double (equal to rounding); on the GPU
// against that CPU result.
static void check_rope_positions(Device dev, DType dt) {
  const int64_t B = 2, T = 40, Hr = 3, Hv = 2, D = 16, W = (Hr + Hv) * D;
  const auto seg = packed_segment_ids(B, T, 12, 5);
  std::vector<int32_t> pos(seg.size());
  for (int64_t b = 0; b < B; ++b)
    for (const auto& tok : segment_tokens(seg, b, T))
      for (size_t i = 0; i < tok.size(); ++i) pos[size_t(b * T + tok[i])] = int32_t(i);
  auto packed = round_to(randn(size_t(B * T * W), 331), dt);
  for (double sign : {+1.0, -1.0}) {
    SCOPED_TRACE(std::string(sign > 0 ? "forward " : "backward ") + std::string(dtype_name(dt)));
    // Reference: each segment's rotated heads as a dense [n, Hr, D] sequence from position 0.
    std::vector<double> want(size_t(B * T * Hr * D));
    for (int64_t b = 0; b < B; ++b)
      for (const auto& tok : segment_tokens(seg, b, T)) {
        const int64_t n = int64_t(tok.size());
        std::vector<double> x(size_t(n * Hr * D)), y(x.size());
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < Hr * D; ++j)
            x[size_t(i * Hr * D + j)] = packed[size_t((b * T + tok[size_t(i)]) * W + j)];
        if (sign > 0) cpu::rope_forward(nullptr, DType::F64, y.data(), x.data(), 1, n, Hr, D, 1e4f, 0);
        else cpu::rope_backward(nullptr, DType::F64, y.data(), x.data(), 1, n, Hr, D, 1e4f, 0);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < Hr * D; ++j)
            want[size_t((b * T + tok[size_t(i)]) * Hr * D + j)] = y[size_t(i * Hr * D + j)];
      }
    std::vector<double> out(packed.begin(), packed.end());
    if (dev.is_cpu()) {
      if (sign > 0) cpu::rope_forward(nullptr, DType::F64, out.data(), out.data(), B, T, Hr, D, 1e4f, 0, W, pos.data());
      else cpu::rope_backward(nullptr, DType::F64, out.data(), out.data(), B, T, Hr, D, 1e4f, 0, W, pos.data());
    } else {
      Tensor g = upload(packed, dt), gpos = upload(std::vector<float>(pos.begin(), pos.end()), DType::I32);
      if (sign > 0) cuda::rope_forward(nullptr, dt, g.data(), g.data(), B, T, Hr, D, 1e4f, 0, W, gpos.data<int32_t>());
      else cuda::rope_backward(nullptr, dt, g.data(), g.data(), B, T, Hr, D, 1e4f, 0, W, gpos.data<int32_t>());
      auto o = download(g);
      out.assign(o.begin(), o.end());
    }
    std::vector<double> got(want.size());
    for (int64_t r = 0; r < B * T; ++r) {
      for (int64_t j = 0; j < Hr * D; ++j) got[size_t(r * Hr * D + j)] = out[size_t(r * W + j)];
      for (int64_t j = Hr * D; j < W; ++j)
        ASSERT_EQ(out[size_t(r * W + j)], double(packed[size_t(r * W + j)])) << "v head touched";
    }
    EXPECT_LE(rel_error(got, want), dev.is_cpu() ? 1e-15 : tolerance(dt));
  }
}

TEST(Rope, CpuPositionsRestartEachSegment) {
  check_rope_positions(Device::cpu(), DType::F32);
  // Explicit positions replace pos_offset; both at once is a caller's mistake.
  std::vector<float> x(4);
  std::vector<int32_t> pos = {0};
  EXPECT_DEATH(cpu::rope_forward(nullptr, DType::F32, x.data(), x.data(), 1, 1, 1, 4, 1e4f, 3, 0, pos.data()),
               "together with explicit positions");
}

TEST(RopeGpu, MatchesCpuWithPositions) {
  ZP_SKIP_WITHOUT_GPU();
  for (DType dt : gpu_float_dtypes()) check_rope_positions(Device::cuda(), dt);
}

// ---------------------------------------------------------------------------------------------------
// Nearest 2x upsampling

TEST(Upsample, CpuHandValues) {
  std::vector<float> x = {1, 2, 3, 4, 5, 6}, y(24), dx(6);  // [1, 1, 2, 3]
  cpu::upsample_nearest2x_forward(nullptr, DType::F32, y.data(), x.data(), 1, 1, 2, 3);
  EXPECT_EQ(y, (std::vector<float>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 4, 4, 5, 5, 6, 6}));
  std::vector<float> dy(24);
  for (size_t i = 0; i < 24; ++i) dy[i] = float(i);
  cpu::upsample_nearest2x_backward(nullptr, DType::F32, dx.data(), dy.data(), 1, 1, 2, 3);
  EXPECT_EQ(dx, (std::vector<float>{0 + 1 + 6 + 7, 2 + 3 + 8 + 9, 4 + 5 + 10 + 11, 12 + 13 + 18 + 19,
                                    14 + 15 + 20 + 21, 16 + 17 + 22 + 23}));
}

TEST(Upsample, CpuBackwardMatchesFiniteDifferences) {
  const int64_t N = 1, C = 3, H = 5, W = 7;
  auto x = to_double(randn(static_cast<size_t>(N * C * H * W), 91)), w = to_double(randn(static_cast<size_t>(N * C * 4 * H * W), 92));
  std::vector<double> y(w.size()), dx(x.size());
  auto loss = [&] {
    cpu::upsample_nearest2x_forward(nullptr, DType::F64, y.data(), x.data(), N, C, H, W);
    return dot(y, w);
  };
  cpu::upsample_nearest2x_backward(nullptr, DType::F64, dx.data(), w.data(), N, C, H, W);
  expect_grad_matches_fd(x, dx, loss, "upsample");
}

TEST(UpsampleGpu, MatchesCpu) {
  ZP_SKIP_WITHOUT_GPU();
  struct Case { int64_t N, C, H, W; };
  for (Case k : {Case{1, 3, 5, 7}, Case{2, 4, 33, 17}, Case{1, 1, 1, 1}, Case{2, 320, 32, 32}}) {
    const int64_t nx = k.N * k.C * k.H * k.W, ny = 4 * nx;
    for (DType dt : gpu_float_dtypes()) {
      auto x = round_to(randn(static_cast<size_t>(nx), 95 + k.W), dt), dy = round_to(randn(static_cast<size_t>(ny), 96 + k.W), dt);
      Tensor gx = upload(x, dt), gdy = upload(dy, dt);
      Tensor gy = Tensor::empty({ny}, dt, Device::cuda()), gdx = Tensor::empty({nx}, dt, Device::cuda());
      cuda::upsample_nearest2x_forward(nullptr, dt, gy.data(), gx.data(), k.N, k.C, k.H, k.W);
      cuda::upsample_nearest2x_backward(nullptr, dt, gdx.data(), gdy.data(), k.N, k.C, k.H, k.W);
      std::vector<float> y(static_cast<size_t>(ny)), dx(static_cast<size_t>(nx));
      cpu::upsample_nearest2x_forward(nullptr, DType::F32, y.data(), x.data(), k.N, k.C, k.H, k.W);
      cpu::upsample_nearest2x_backward(nullptr, DType::F32, dx.data(), dy.data(), k.N, k.C, k.H, k.W);
      std::string what = std::string(dtype_name(dt)) + " H=" + std::to_string(k.H) + " W=" + std::to_string(k.W);
      EXPECT_EQ(download(gy), y) << "forward is a copy " << what;
      EXPECT_LE(rel_error(download(gdx), dx), tolerance(dt)) << "backward " << what;
    }
  }
}

}  // namespace zp::test
