// Softmax and attention: finite differences of the CPU references in F64, hand-checked cases, and
// the CUDA kernels against the CPU references.
#include <cmath>

#include "kernels/attention.h"
#include "kernels/softmax.h"
#include "nn/attention.h"
#include "nn/parameter.h"
#include "packed_segments.h"
#include "test_util.h"

namespace zp::test {
using namespace zp::kernels;

// ---------------------------------------------------------------------------------------------
// Softmax

TEST(Softmax, CpuHandChecked) {
  // Row 0 is uniform; rows 1..3 are one causal [3, 3] block: row r sees columns 0..r.
  std::vector<float> x = {2, 2, 2, 2, 5, 1, -3, 0, 0, 9, 0, 1, 2};
  std::vector<float> y(4 * 3);
  cpu::softmax_forward(nullptr, DType::F32, y.data(), x.data(), 1, 4, 1.f, 0);
  for (int c = 0; c < 4; ++c) EXPECT_FLOAT_EQ(y[size_t(c)], 0.25f);
  cpu::softmax_forward(nullptr, DType::F32, y.data(), x.data() + 4, 3, 3, 1.f, 3);
  EXPECT_FLOAT_EQ(y[0], 1.f);
  EXPECT_EQ(y[1], 0.f);
  EXPECT_EQ(y[2], 0.f);
  EXPECT_FLOAT_EQ(y[3], 0.5f);  // row 1 sees x = {0, 0}
  EXPECT_FLOAT_EQ(y[4], 0.5f);
  EXPECT_EQ(y[5], 0.f);
  double e = std::exp(1.0), z = 1 + e + e * e;  // row 2 sees {0, 1, 2}
  EXPECT_NEAR(y[6], 1 / z, 1e-6);
  EXPECT_NEAR(y[8], e * e / z, 1e-6);
}

TEST(Softmax, CpuBackwardMatchesFiniteDifferences) {
  for (int64_t causal_T : {0, 5}) {
    const int64_t N = 10, C = 5;
    const float scale = 0.7f;
    auto x = to_double(randn(size_t(N * C), 11, 2.f));
    auto w = to_double(randn(size_t(N * C), 12));
    std::vector<double> y(x.size()), dx(x.size());
    auto loss = [&] {
      cpu::softmax_forward(nullptr, DType::F64, y.data(), x.data(), N, C, scale, causal_T);
      double s = 0;
      for (size_t i = 0; i < y.size(); ++i) s += w[i] * y[i];
      return s;
    };
    loss();
    cpu::softmax_backward(nullptr, DType::F64, dx.data(), w.data(), y.data(), N, C, scale);
    expect_grad_matches_fd(x, dx, loss, causal_T ? "softmax dx (causal)" : "softmax dx");
  }
}

TEST(SoftmaxGpu, MatchesCpu) {
  ZP_SKIP_WITHOUT_GPU();
  struct Case { int64_t N, C, causal_T; };
  // Rows of up to 1024 get a warp each, longer rows a block each.
  for (Case c : {Case{1, 1, 0}, Case{7, 33, 0}, Case{64, 77, 0}, Case{3 * 17, 17, 17}, Case{2 * 96, 96, 96},
                 Case{5, 1500, 0}, Case{3, 50257, 0}, Case{2 * 1100, 1100, 1100}}) {
    for (DType dt : gpu_float_dtypes()) {
      size_t n = size_t(c.N * c.C);
      auto x = round_to(randn(n, 21 + n, 3.f), dt), dy = round_to(randn(n, 22 + n), dt);
      const float scale = 0.5f;
      std::vector<float> y(n), dx(n);
      cpu::softmax_forward(nullptr, DType::F32, y.data(), x.data(), c.N, c.C, scale, c.causal_T);
      // The GPU backward sees the GPU's rounded y; so does the reference.
      Tensor gx = upload(x, dt), gy = Tensor::empty({int64_t(n)}, dt, Device::cuda());
      cuda::softmax_forward(nullptr, dt, gy.data(), gx.data(), c.N, c.C, scale, c.causal_T);
      auto y_gpu = download(gy);
      EXPECT_LE(rel_error(y_gpu, y), tolerance(dt)) << dtype_name(dt) << " N=" << c.N << " C=" << c.C;
      cpu::softmax_backward(nullptr, DType::F32, dx.data(), dy.data(), y_gpu.data(), c.N, c.C, scale);
      Tensor gdy = upload(dy, dt), gdx = Tensor::empty({int64_t(n)}, dt, Device::cuda());
      cuda::softmax_backward(nullptr, dt, gdx.data(), gdy.data(), gy.data(), c.N, c.C, scale);
      EXPECT_LE(rel_error(download(gdx), dx), tolerance(dt)) << dtype_name(dt) << " backward N=" << c.N;
      // In place: y over x, dx over dy.
      cuda::softmax_forward(nullptr, dt, gx.data(), gx.data(), c.N, c.C, scale, c.causal_T);
      EXPECT_EQ(download(gx), y_gpu) << "in-place forward";
      cuda::softmax_backward(nullptr, dt, gdy.data(), gdy.data(), gy.data(), c.N, c.C, scale);
      EXPECT_EQ(download(gdy), download(gdx)) << "in-place backward";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Attention

struct AttnCase {
  int64_t B, Tq, Tk, Hq, Hkv, D;
  bool causal;
  bool packed;  // q, k, v are views into one [B, T, (Hq + 2 Hkv) D] buffer (needs Tq == Tk)
};

std::ostream& operator<<(std::ostream& o, const AttnCase& c) {
  return o << "B=" << c.B << " Tq=" << c.Tq << " Tk=" << c.Tk << " Hq=" << c.Hq << " Hkv=" << c.Hkv
           << " D=" << c.D << (c.causal ? " causal" : "") << (c.packed ? " packed" : "");
}

// All inputs live in one buffer `in` (so one finite-difference loop covers dq, dk and dv): either
// packed qkv, or three regions whose rows carry a little padding to exercise the strides.
struct AttnLayout {
  int64_t qs, ks, vs, os, q_off, k_off, v_off, in_size, out_size, lse_size;
};

AttnLayout layout_for(const AttnCase& c) {
  AttnLayout L{};
  if (c.packed) {
    EXPECT_EQ(c.Tq, c.Tk);
    L.qs = L.ks = L.vs = (c.Hq + 2 * c.Hkv) * c.D;
    L.q_off = 0;
    L.k_off = c.Hq * c.D;
    L.v_off = (c.Hq + c.Hkv) * c.D;
    L.in_size = c.B * c.Tq * L.qs;
    L.os = c.Hq * c.D;
  } else {
    L.qs = c.Hq * c.D + 1;
    L.ks = c.Hkv * c.D + 2;
    L.vs = c.Hkv * c.D + 3;
    L.os = c.Hq * c.D + 1;
    L.q_off = 0;
    L.k_off = c.B * c.Tq * L.qs;
    L.v_off = L.k_off + c.B * c.Tk * L.ks;
    L.in_size = L.v_off + c.B * c.Tk * L.vs;
  }
  L.out_size = c.B * c.Tq * L.os;
  L.lse_size = c.B * c.Hq * c.Tq;
  return L;
}

// The [rows, width] block at `off` with row stride `stride` (one of q, k, v, out out of a buffer).
template <class X>
std::vector<X> gather(const std::vector<X>& buf, int64_t off, int64_t stride, int64_t rows, int64_t width) {
  std::vector<X> r;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t d = 0; d < width; ++d) r.push_back(buf[size_t(off + i * stride + d)]);
  return r;
}

TEST(Attention, CpuSingleTokenReturnsV) {
  // One key: softmax is 1, out = v of the head's kv group, lse = scale * q.k.
  const int64_t Hq = 4, Hkv = 2, D = 3;
  auto q = randn(size_t(Hq * D), 31), k = randn(size_t(Hkv * D), 32), v = randn(size_t(Hkv * D), 33);
  std::vector<float> out(size_t(Hq * D)), lse(static_cast<size_t>(Hq));
  for (bool causal : {false, true}) {
    cpu::attention_forward(nullptr, DType::F32, out.data(), lse.data(), q.data(), k.data(), v.data(), 1, 1, 1, Hq,
                           Hkv, D, 0, 0, 0, 0, 0.5f, causal);
    for (int64_t h = 0; h < Hq; ++h) {
      int64_t hk = h / 2;
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) {
        EXPECT_FLOAT_EQ(out[size_t(h * D + d)], v[size_t(hk * D + d)]);
        dot += double(q[size_t(h * D + d)]) * k[size_t(hk * D + d)];
      }
      EXPECT_NEAR(lse[size_t(h)], 0.5 * dot, 1e-6);
    }
  }
}

TEST(Attention, CpuZeroQueryAveragesVisibleValues) {
  // q = 0 makes every visible key equally likely: causal query i averages v_0..v_{i + Tk - Tq}.
  const int64_t Tq = 3, Tk = 5, D = 2;
  std::vector<float> q(size_t(Tq * D), 0.f), k = randn(size_t(Tk * D), 41), v = randn(size_t(Tk * D), 42);
  std::vector<float> out(size_t(Tq * D)), lse(static_cast<size_t>(Tq));
  cpu::attention_forward(nullptr, DType::F32, out.data(), lse.data(), q.data(), k.data(), v.data(), 1, Tq, Tk, 1, 1,
                         D, 0, 0, 0, 0, attention_default_scale(D), true);
  for (int64_t i = 0; i < Tq; ++i) {
    int64_t n = i + (Tk - Tq) + 1;
    EXPECT_NEAR(lse[size_t(i)], std::log(double(n)), 1e-6);
    for (int64_t d = 0; d < D; ++d) {
      double mean = 0;
      for (int64_t j = 0; j < n; ++j) mean += v[size_t(j * D + d)] / double(n);
      EXPECT_NEAR(out[size_t(i * D + d)], mean, 1e-6);
    }
  }
}

TEST(Attention, CpuGroupedQueryEqualsRepeatedKv) {
  // Hq = 4 over Hkv = 2 is the same as Hkv = 4 with each kv head repeated twice.
  const int64_t T = 6, Hq = 4, D = 3;
  auto q = randn(size_t(T * Hq * D), 51), k = randn(size_t(T * 2 * D), 52), v = randn(size_t(T * 2 * D), 53);
  std::vector<float> k4, v4;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t d = 0; d < D; ++d) {
        k4.push_back(k[size_t((t * 2 + h / 2) * D + d)]);
        v4.push_back(v[size_t((t * 2 + h / 2) * D + d)]);
      }
  std::vector<float> o2(q.size()), o4(q.size()), l2(size_t(Hq * T)), l4(l2.size());
  cpu::attention_forward(nullptr, DType::F32, o2.data(), l2.data(), q.data(), k.data(), v.data(), 1, T, T, Hq, 2, D,
                         0, 0, 0, 0, 0.4f, true);
  cpu::attention_forward(nullptr, DType::F32, o4.data(), l4.data(), q.data(), k4.data(), v4.data(), 1, T, T, Hq, 4,
                         D, 0, 0, 0, 0, 0.4f, true);
  EXPECT_EQ(o2, o4);
  EXPECT_EQ(l2, l4);
}

TEST(Attention, CpuBackwardMatchesFiniteDifferences) {
  for (AttnCase c : {AttnCase{2, 3, 3, 2, 2, 5, true, false}, AttnCase{2, 4, 4, 2, 2, 3, false, false},
                     AttnCase{1, 4, 6, 4, 2, 3, false, false},  // cross-attention, GQA
                     AttnCase{1, 4, 6, 4, 2, 3, true, false},   // bottom-right causal, Tq < Tk
                     AttnCase{1, 5, 3, 2, 1, 4, true, false},   // Tq > Tk: queries 0, 1 see no key
                     AttnCase{2, 5, 5, 4, 2, 3, true, true}}) {  // packed qkv
    SCOPED_TRACE(::testing::PrintToString(c));
    AttnLayout L = layout_for(c);
    auto in = to_double(randn(size_t(L.in_size), 61 + c.D));
    auto w = to_double(randn(size_t(L.out_size), 62 + c.D));
    std::vector<double> out(size_t(L.out_size), 0.0), g(size_t(L.in_size), 0.0);
    std::vector<float> lse(size_t(L.lse_size));
    const float scale = 0.8f;
    auto loss = [&] {
      cpu::attention_forward(nullptr, DType::F64, out.data(), lse.data(), in.data() + L.q_off, in.data() + L.k_off,
                             in.data() + L.v_off, c.B, c.Tq, c.Tk, c.Hq, c.Hkv, c.D, L.qs, L.ks, L.vs, L.os, scale,
                             c.causal);
      double s = 0;
      for (size_t i = 0; i < out.size(); ++i) s += w[i] * out[i];
      return s;
    };
    loss();
    cpu::attention_backward(nullptr, DType::F64, g.data() + L.q_off, g.data() + L.k_off, g.data() + L.v_off,
                            w.data(), in.data() + L.q_off, in.data() + L.k_off, in.data() + L.v_off, out.data(),
                            lse.data(), c.B, c.Tq, c.Tk, c.Hq, c.Hkv, c.D, L.qs, L.ks, L.vs, L.os, scale, c.causal);
    expect_grad_matches_fd(in, g, loss, "attention dq/dk/dv", 1e-6, 1e-6, 400);
    if (c.Tq > c.Tk && c.causal) {
      // A query that sees no key: out = 0, lse = -inf.
      EXPECT_EQ(out[0], 0.0);
      EXPECT_EQ(lse[0], -INFINITY);
    }
  }
}

// Packed sequences: attention over a row of several segments equals attention over each segment run as
// a sequence of its own (forward out and lse, and dq, dk, dv), in double, so the two agree to rounding.
void check_segments_equal_separate(const AttnCase& c, const std::vector<int32_t>& seg) {
  SCOPED_TRACE(::testing::PrintToString(c));
  ASSERT_EQ(c.Tq, c.Tk);
  const int64_t T = c.Tq, Hq = c.Hq, Hkv = c.Hkv, D = c.D;
  AttnLayout L = layout_for(c);
  auto in = to_double(randn(size_t(L.in_size), 71 + D));
  auto dout = to_double(randn(size_t(L.out_size), 72 + D));
  std::vector<double> out(size_t(L.out_size), 0.0), g(size_t(L.in_size), 0.0);
  std::vector<float> lse(size_t(L.lse_size));
  const float scale = 0.8f;
  cpu::attention_forward(nullptr, DType::F64, out.data(), lse.data(), in.data() + L.q_off, in.data() + L.k_off,
                         in.data() + L.v_off, c.B, T, T, Hq, Hkv, D, L.qs, L.ks, L.vs, L.os, scale, c.causal,
                         seg.data());
  cpu::attention_backward(nullptr, DType::F64, g.data() + L.q_off, g.data() + L.k_off, g.data() + L.v_off,
                          dout.data(), in.data() + L.q_off, in.data() + L.k_off, in.data() + L.v_off, out.data(),
                          lse.data(), c.B, T, T, Hq, Hkv, D, L.qs, L.ks, L.vs, L.os, scale, c.causal, seg.data());

  // The same values, segment by segment: got_* from the packed run, want_* from a run of the segment alone.
  std::vector<double> got_o, want_o, got_q, want_q, got_k, want_k, got_v, want_v;
  std::vector<float> got_l, want_l;
  int64_t n_segments = 0;
  for (int64_t b = 0; b < c.B; ++b)
    for (const auto& tok : segment_tokens(seg, b, T)) {
      ++n_segments;
      const int64_t n = int64_t(tok.size());
      // Contiguous copies of the segment's rows of q, k, v (and dout).
      auto rows = [&](const std::vector<double>& buf, int64_t off, int64_t stride, int64_t width) {
        std::vector<double> r;
        for (int64_t t : tok)
          for (int64_t d = 0; d < width; ++d) r.push_back(buf[size_t(off + (b * T + t) * stride + d)]);
        return r;
      };
      auto q = rows(in, L.q_off, L.qs, Hq * D), k = rows(in, L.k_off, L.ks, Hkv * D);
      auto v = rows(in, L.v_off, L.vs, Hkv * D), dos = rows(dout, 0, L.os, Hq * D);
      std::vector<double> o(q.size()), dq(q.size()), dk(k.size()), dv(v.size());
      std::vector<float> l(size_t(Hq * n));
      cpu::attention_forward(nullptr, DType::F64, o.data(), l.data(), q.data(), k.data(), v.data(), 1, n, n, Hq, Hkv,
                             D, 0, 0, 0, 0, scale, c.causal);
      cpu::attention_backward(nullptr, DType::F64, dq.data(), dk.data(), dv.data(), dos.data(), q.data(), k.data(),
                              v.data(), o.data(), l.data(), 1, n, n, Hq, Hkv, D, 0, 0, 0, 0, scale, c.causal);
      auto append = [](std::vector<double>& dst, const std::vector<double>& src) {
        dst.insert(dst.end(), src.begin(), src.end());
      };
      append(got_o, rows(out, 0, L.os, Hq * D));
      append(want_o, o);
      append(got_q, rows(g, L.q_off, L.qs, Hq * D));
      append(want_q, dq);
      append(got_k, rows(g, L.k_off, L.ks, Hkv * D));
      append(want_k, dk);
      append(got_v, rows(g, L.v_off, L.vs, Hkv * D));
      append(want_v, dv);
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t i = 0; i < n; ++i) {
          got_l.push_back(lse[size_t((b * Hq + h) * T + tok[size_t(i)])]);
          want_l.push_back(l[size_t(h * n + i)]);
        }
    }
  EXPECT_GE(n_segments, 2 * c.B) << "the ids should give every row several segments";
  EXPECT_LE(rel_error(got_o, want_o), 1e-12) << "out";
  EXPECT_LE(rel_error(got_l, want_l), 1e-7) << "lse";
  EXPECT_LE(rel_error(got_q, want_q), 1e-12) << "dq";
  EXPECT_LE(rel_error(got_k, want_k), 1e-12) << "dk";
  EXPECT_LE(rel_error(got_v, want_v), 1e-12) << "dv";
}

TEST(Attention, CpuSegmentsEqualSeparateSequences) {
  // Row 0: sorted segments of 4, 1, 6 and 2 tokens. Row 1: id 5 recurs after id 7, and -1 (padding) is
  // a segment of its own.
  const std::vector<int32_t> hand = {0, 0, 0, 0, 1, 2, 2, 2, 2, 2, 2, 3, 3,  //
                                     5, 5, 7, 7, 7, 5, 9, 9, 9, 9, -1, -1, -1};
  for (AttnCase c : {AttnCase{2, 13, 13, 4, 2, 3, true, true},     // GQA, packed qkv
                     AttnCase{2, 13, 13, 4, 2, 3, false, true},    // bidirectional
                     AttnCase{2, 13, 13, 2, 2, 5, true, false},    // strided q, k, v, out
                     AttnCase{2, 13, 13, 6, 3, 4, false, false}})
    check_segments_equal_separate(c, hand);
  for (AttnCase c : {AttnCase{4, 40, 40, 4, 1, 3, true, true}, AttnCase{4, 40, 40, 2, 2, 3, false, false}})
    check_segments_equal_separate(c, packed_segment_ids(c.B, c.Tq, 9, 77));
}

TEST(Attention, CpuSegmentsNeedOneSequenceLength) {
  std::vector<float> q(2 * 4), k(3 * 4), v(3 * 4), out(2 * 4), lse(2);
  std::vector<int32_t> seg(3, 0);
  EXPECT_DEATH(cpu::attention_forward(nullptr, DType::F32, out.data(), lse.data(), q.data(), k.data(), v.data(), 1, 2,
                                     3, 1, 1, 4, 0, 0, 0, 0, 0.5f, true, seg.data()),
               "segments need Tq == Tk");
}

// nn::SelfAttention with a TokenLayout (segments and RoPE positions restarting per segment) on a packed
// row: outputs and input gradients equal those of each segment run alone, and the parameter gradients
// their sum.
TEST(Attention, SelfAttentionPackedRowEqualsSeparateSequences) {
  const int64_t B = 2, T = 12, C = 8, Hq = 2, Hkv = 1, D = 4;
  const std::vector<int32_t> seg = {0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,  //
                                    4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6};
  std::vector<int32_t> pos(seg.size());
  for (int64_t b = 0; b < B; ++b)
    for (const auto& tok : segment_tokens(seg, b, T))
      for (size_t i = 0; i < tok.size(); ++i) pos[size_t(b * T + tok[i])] = int32_t(i);
  nn::ParamBlock blk("attn");
  nn::Parameter* wqkv = blk.add("qkv.weight", {(Hq + 2 * Hkv) * D, C}, true);
  nn::Parameter* wo = blk.add("o.weight", {C, Hq * D}, true);
  blk.allocate(Device::cpu(), DType::F64);
  for (auto [p, seed] : {std::pair{wqkv, 1}, std::pair{wo, 2}}) {
    auto r = randn(size_t(p->numel()), uint64_t(seed), 0.5f);
    std::copy(r.begin(), r.end(), p->value.data<double>());
  }
  nn::AttentionShape shape{Hq, Hkv, D, /*rope=*/true, 10000.f, /*causal=*/true};
  nn::SelfAttention attn(nn::Linear(wqkv, nullptr), nn::Linear(wo, nullptr), shape);
  const nn::Ctx c{Device::cpu(), nullptr, DType::F64};
  auto x = to_double(randn(size_t(B * T * C), 3)), dy = to_double(randn(size_t(B * T * C), 4));

  blk.zero_grad();
  std::vector<double> y(x.size()), dx(x.size());
  {
    nn::SelfAttention::Saved sv;
    const nn::TokenLayout tokens{seg.data(), pos.data()};
    attn.forward(c, y.data(), x.data(), B, T, sv, nullptr, tokens);
    attn.backward(c, dx.data(), Tensor::from_blob(dy.data(), {B * T, C}, DType::F64, Device::cpu()),
                  Tensor::from_blob(x.data(), {B * T, C}, DType::F64, Device::cpu()), B, T, sv, false, tokens);
  }
  std::vector<float> g_packed(wqkv->g(), wqkv->g() + wqkv->numel());
  g_packed.insert(g_packed.end(), wo->g(), wo->g() + wo->numel());

  blk.zero_grad();
  std::vector<double> y_sep(x.size()), dx_sep(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (const auto& tok : segment_tokens(seg, b, T)) {
      const int64_t n = int64_t(tok.size());
      std::vector<double> xs, dys, ys(size_t(n * C)), dxs(size_t(n * C));
      for (int64_t t : tok) {
        xs.insert(xs.end(), x.begin() + (b * T + t) * C, x.begin() + (b * T + t + 1) * C);
        dys.insert(dys.end(), dy.begin() + (b * T + t) * C, dy.begin() + (b * T + t + 1) * C);
      }
      nn::SelfAttention::Saved sv;
      attn.forward(c, ys.data(), xs.data(), 1, n, sv);
      attn.backward(c, dxs.data(), Tensor::from_blob(dys.data(), {n, C}, DType::F64, Device::cpu()),
                    Tensor::from_blob(xs.data(), {n, C}, DType::F64, Device::cpu()), 1, n, sv, false);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < C; ++j) {
          y_sep[size_t((b * T + tok[size_t(i)]) * C + j)] = ys[size_t(i * C + j)];
          dx_sep[size_t((b * T + tok[size_t(i)]) * C + j)] = dxs[size_t(i * C + j)];
        }
    }
  std::vector<float> g_sep(wqkv->g(), wqkv->g() + wqkv->numel());
  g_sep.insert(g_sep.end(), wo->g(), wo->g() + wo->numel());

  EXPECT_LE(rel_error(y, y_sep), 1e-12) << "y";
  EXPECT_LE(rel_error(dx, dx_sep), 1e-12) << "dx";
  EXPECT_LE(rel_error(g_packed, g_sep), 1e-6) << "parameter gradients (fp32)";
  // Without the layout the row is one sequence: a different result, so the comparison above can fail.
  std::vector<double> y_one(x.size());
  nn::SelfAttention::Saved sv;
  attn.forward(c, y_one.data(), x.data(), B, T, sv);
  EXPECT_GT(rel_error(y_one, y_sep), 1e-3);
}

// lse may hold -inf (queries that see no key): those must match exactly, the rest by relative error.
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

// The CUDA attention (whichever path the case takes) against the CPU reference, with segment ids [B, T]
// when `seg` is not empty.
void check_gpu_against_cpu(const AttnCase& c, DType dt, const std::vector<int32_t>& seg = {}) {
  SCOPED_TRACE(::testing::PrintToString(c) + " " + std::string(dtype_name(dt)) + (seg.empty() ? "" : " segments"));
  AttnLayout L = layout_for(c);
  uint64_t seed = uint64_t(c.Tq * 1000 + c.D);
  auto in = round_to(randn(size_t(L.in_size), seed), dt);
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
                           g_lse.data<float>(), c.B, c.Tq, c.Tk, c.Hq, c.Hkv, c.D, L.qs, L.ks, L.vs, L.os,
                           scale, c.causal, gpu_seg);

  std::vector<float> out(size_t(L.out_size), 0.f), lse(size_t(L.lse_size)), grad(size_t(L.in_size), 0.f);
  cpu::attention_forward(nullptr, DType::F32, out.data(), lse.data(), in.data() + L.q_off, in.data() + L.k_off,
                         in.data() + L.v_off, c.B, c.Tq, c.Tk, c.Hq, c.Hkv, c.D, L.qs, L.ks, L.vs, L.os, scale,
                         c.causal, cpu_seg);
  cpu::attention_backward(nullptr, DType::F32, grad.data() + L.q_off, grad.data() + L.k_off,
                          grad.data() + L.v_off, dout.data(), in.data() + L.q_off, in.data() + L.k_off,
                          in.data() + L.v_off, out.data(), lse.data(), c.B, c.Tq, c.Tk, c.Hq, c.Hkv, c.D, L.qs,
                          L.ks, L.vs, L.os, scale, c.causal, cpu_seg);

  EXPECT_LE(rel_error(download(g_out), out), tolerance(dt)) << "out";
  auto lse_gpu = download(g_lse);
  lse_gpu.resize(lse.size());
  expect_lse_close(lse_gpu, lse, 1e-5);
  // fp32 backward: the recomputed probabilities go through the fp32 lse and the delta through
  // the stored out, both rounded once more than in the reference, so allow a little more.
  double tol = dt == DType::F32 ? 5e-5 : tolerance(dt);
  auto g = download(g_grad);
  EXPECT_LE(rel_error(gather(g, L.q_off, L.qs, c.B * c.Tq, c.Hq * c.D),
                      gather(grad, L.q_off, L.qs, c.B * c.Tq, c.Hq * c.D)), tol) << "dq";
  EXPECT_LE(rel_error(gather(g, L.k_off, L.ks, c.B * c.Tk, c.Hkv * c.D),
                      gather(grad, L.k_off, L.ks, c.B * c.Tk, c.Hkv * c.D)), tol) << "dk";
  EXPECT_LE(rel_error(gather(g, L.v_off, L.vs, c.B * c.Tk, c.Hkv * c.D),
                      gather(grad, L.v_off, L.vs, c.B * c.Tk, c.Hkv * c.D)), tol) << "dv";
  // Padding between rows was never written.
  if (!c.packed) EXPECT_EQ(g[size_t(L.q_off + L.qs - 1)], 0.f) << "dq row padding";
}

TEST(AttentionGpu, MatchesCpu) {
  ZP_SKIP_WITHOUT_GPU();
  const std::vector<AttnCase> cases = {
      {1, 1, 1, 1, 1, 8, false, false},     {1, 1, 1, 1, 1, 8, true, false},
      {2, 17, 17, 4, 2, 40, true, false},   {2, 17, 17, 4, 2, 40, false, false},
      {1, 128, 128, 12, 12, 64, true, false},
      {2, 64, 77, 8, 8, 40, false, false},  // UNet cross-attention
      {1, 256, 256, 2, 2, 160, true, false},
      {2, 33, 33, 4, 2, 5, true, true},     // odd head dim, packed qkv
      {2, 50, 50, 6, 2, 64, true, true},    // GPT-style packed qkv with GQA
      {1, 40, 20, 2, 1, 72, true, false},   // Tq > Tk: some queries see no key
      {1, 20, 45, 3, 1, 256, true, false},  // largest head dim, Tq < Tk
      {3, 9, 31, 2, 2, 80, false, false},
      {2, 64, 64, 4, 4, 16, true, true},    // the demo GPT-2: head dim 16 (zero-padded flash), packed, causal
      {2, 200, 200, 4, 4, 16, true, true}}; // the same over several query and key tiles
  for (const AttnCase& c : cases)
    for (DType dt : gpu_float_dtypes()) check_gpu_against_cpu(c, dt);
}

// Packed sequences on the general fp32-tile kernels (f32, and every dtype at head dims 5 and 72) and on
// the zero-padded flash path (bf16 / f16 at head dims 16 and 40); runs of up to 45 tokens span several
// 32-token tiles, and odd rows reuse ids out of order (kernels/cuda/flash_attention.cu has its own test).
TEST(AttentionGpu, MatchesCpuWithSegments) {
  ZP_SKIP_WITHOUT_GPU();
  const std::vector<AttnCase> cases = {
      {2, 200, 200, 4, 2, 72, true, true},    {2, 200, 200, 4, 2, 72, false, true},
      {2, 150, 150, 4, 4, 16, false, true},   {1, 97, 97, 6, 2, 5, true, false},
      {2, 130, 130, 2, 1, 40, true, false},   {3, 64, 64, 2, 2, 32, false, false},
      {2, 1, 1, 1, 1, 8, true, false}};
  for (const AttnCase& c : cases) {
    auto seg = packed_segment_ids(c.B, c.Tq, 45, uint64_t(c.Tq + c.D));
    for (DType dt : gpu_float_dtypes()) check_gpu_against_cpu(c, dt, seg);
  }
}

}  // namespace zp::test
