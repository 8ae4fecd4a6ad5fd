// AdamW (kernels/adamw.h) and the multi-tensor L2 norm used for gradient clipping (kernels/reduce.h).
#include <cmath>
#include <limits>

#include "kernels/adamw.h"
#include "kernels/reduce.h"
#include "test_util.h"

namespace zp::test {
using namespace zp::kernels;

namespace {

// torch.optim.AdamW's _single_tensor_adamw, one element at a time, written out independently.
void torch_adamw_reference(std::vector<float>& p, const std::vector<float>& grad, std::vector<float>& m,
                           std::vector<float>& v, double lr, double beta1, double beta2, double eps, double wd,
                           int64_t step, float grad_scale) {
  const double bias_correction1 = 1 - std::pow(beta1, double(step));
  const double bias_correction2 = 1 - std::pow(beta2, double(step));
  const double step_size = lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  for (size_t i = 0; i < p.size(); ++i) {
    float g = grad[i] * grad_scale;
    p[i] *= float(1 - lr * wd);                        // param.mul_(1 - lr * weight_decay)
    float w = float(1 - beta1);                         // exp_avg.lerp_(grad, 1 - beta1)
    m[i] = w < 0.5f ? m[i] + w * (g - m[i]) : g - (g - m[i]) * (1 - w);
    v[i] *= float(beta2);                               // exp_avg_sq.mul_(beta2)
    v[i] += float(1 - beta2) * g * g;                   //   .addcmul_(grad, grad, value=1 - beta2)
    float denom = std::sqrt(v[i]) / float(bias_correction2_sqrt) + float(eps);
    p[i] += float(-step_size) * (m[i] / denom);         // param.addcdiv_(exp_avg, denom, value=-step_size)
  }
}

// Max over elements of |a - b| / (|b| + rms(b)): the GPU fuses multiply-adds (the CPU kernel does not:
// it builds with -ffp-contract=off), so results agree with the scalar reference to a few ulps of the
// typical magnitude, not bitwise; elements near zero get the typical magnitude as their scale.
double max_scaled_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double ss = 0;
  for (float x : b) ss += double(x) * x;
  const double rms = std::sqrt(ss / double(std::max<size_t>(b.size(), 1)));
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    worst = std::max(worst, std::abs(double(a[i]) - double(b[i])) / (std::abs(double(b[i])) + rms));
  return worst;
}

// x on the GPU as fp32, preceded by `shift` zeros (shift 1 breaks 16-byte alignment).
Tensor upload_shifted(const std::vector<float>& x, int64_t shift) {
  std::vector<float> y(static_cast<size_t>(shift), 0.f);
  y.insert(y.end(), x.begin(), x.end());
  return upload(y, DType::F32);
}

struct HostState {
  std::vector<float> p, m, v;
  float wd;
};

}  // namespace

TEST(AdamW, CpuHandChecked) {
  // Step 1 from zero moments: m = 0.1 g, v = 0.001 g^2, so m_hat = g, sqrt(v_hat) = |g| and the step
  // is lr * g / (|g| + eps): p = 1 - 0.1 * 2 / (2 + 1e-8); with weight decay 0.5 p first shrinks by 0.05.
  std::vector<float> p = {1.f, 1.f}, g = {2.f, 2.f}, m = {0, 0}, v = {0, 0};
  AdamWTensor t[2] = {{&p[0], &g[0], &m[0], &v[0], nullptr, 1, 0.f}, {&p[1], &g[1], &m[1], &v[1], nullptr, 1, 0.5f}};
  AdamWConfig cfg;
  cfg.lr = 0.1;
  cfg.step = 1;
  cpu::adamw_step(nullptr, t, 2, cfg, DType::F32);
  EXPECT_NEAR(p[0], 0.9f, 1e-6f);
  EXPECT_NEAR(p[1], 0.95f - 0.1f, 1e-6f);
  EXPECT_NEAR(m[0], 0.2f, 1e-7f);
  EXPECT_NEAR(v[0], 0.004f, 1e-9f);
}

TEST(AdamW, CpuMatchesTorchOrderOver3Steps) {
  const std::vector<int64_t> sizes = {1, 3, 1000, 1000003};  // the last one runs on several threads
  const std::vector<float> wds = {0.1f, 0.f, 0.01f, 0.05f};
  std::vector<HostState> ours, ref;
  std::vector<bf16> copy(size_t(sizes.back()));
  for (size_t i = 0; i < sizes.size(); ++i) {
    HostState s{randn(size_t(sizes[i]), 10 + i), std::vector<float>(size_t(sizes[i]), 0.f),
                std::vector<float>(size_t(sizes[i]), 0.f), wds[i]};
    ours.push_back(s);
    ref.push_back(s);
  }
  AdamWConfig cfg;
  cfg.lr = 3e-3;
  cfg.beta1 = 0.9;
  cfg.beta2 = 0.95;
  cfg.eps = 1e-8;
  cfg.grad_scale = 0.25f;
  for (int64_t step = 1; step <= 3; ++step) {
    cfg.step = step;
    std::vector<std::vector<float>> grads;
    std::vector<AdamWTensor> ts;
    for (size_t i = 0; i < sizes.size(); ++i) grads.push_back(randn(size_t(sizes[i]), 100 * step + i, 2.f));
    for (size_t i = 0; i < sizes.size(); ++i)
      ts.push_back({ours[i].p.data(), grads[i].data(), ours[i].m.data(), ours[i].v.data(),
                    i + 1 == sizes.size() ? copy.data() : nullptr, sizes[i], ours[i].wd});
    cpu::adamw_step(nullptr, ts.data(), int(ts.size()), cfg, DType::BF16);
    for (size_t i = 0; i < sizes.size(); ++i)
      torch_adamw_reference(ref[i].p, grads[i], ref[i].m, ref[i].v, cfg.lr, cfg.beta1, cfg.beta2, cfg.eps,
                            ref[i].wd, step, cfg.grad_scale);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    SCOPED_TRACE("n=" + std::to_string(sizes[i]));
    EXPECT_LE(max_scaled_diff(ours[i].p, ref[i].p), 1e-6);
    EXPECT_LE(max_scaled_diff(ours[i].m, ref[i].m), 1e-6);
    EXPECT_LE(max_scaled_diff(ours[i].v, ref[i].v), 1e-6);
    EXPECT_LE(rel_error(ours[i].p, ref[i].p), 1e-6);
  }
  for (size_t j = 0; j < copy.size(); ++j) ASSERT_EQ(copy[j].bits, bf16(ours.back().p[j]).bits) << j;
}

TEST(AdamWGpu, MatchesCpu) {
  ZP_SKIP_WITHOUT_GPU();
  // Odd sizes, a misaligned tensor (scalar path), more tensors than one launch takes (48), copies in
  // bf16 / f16 on some tensors and none on others.
  std::vector<int64_t> sizes = {1, 3, 1000003, 4096, 65537, 16384, 16385};
  for (int i = 0; i < 60; ++i) sizes.push_back(1 + (i * 7919) % 3001);
  for (DType copy_dt : {DType::BF16, DType::F16, DType::F32}) {
    SCOPED_TRACE(std::string("copy ") + std::string(dtype_name(copy_dt)));
    const size_t T = sizes.size();
    std::vector<HostState> host(T);
    std::vector<Tensor> gp(T), gm(T), gv(T), gg(T), gcopy(T);
    std::vector<int64_t> shift(T);  // element offset into the device buffer: 1 breaks float4 alignment
    for (size_t i = 0; i < T; ++i) {
      const size_t n = size_t(sizes[i]);
      shift[i] = i % 5 == 2 ? 1 : 0;
      host[i] = {randn(n, 7 + i), round_to(randn(n, 1000 + i, 0.1f), DType::F32), randu(n, 2000 + i, 0.f, 0.01f),
                 i % 3 == 0 ? 0.f : 0.02f};
      gp[i] = upload_shifted(host[i].p, shift[i]);
      gm[i] = upload_shifted(host[i].m, shift[i]);
      gv[i] = upload_shifted(host[i].v, shift[i]);
      if (i % 2 == 0) gcopy[i] = Tensor::zeros({sizes[i] + shift[i]}, copy_dt, Device::cuda());
    }
    AdamWConfig cfg;
    cfg.lr = 1e-3;
    cfg.grad_scale = 0.5f;
    for (int64_t step = 1; step <= 3; ++step) {
      cfg.step = step;
      std::vector<AdamWTensor> dev_ts, host_ts;
      std::vector<std::vector<float>> grads(T);
      for (size_t i = 0; i < T; ++i) {
        grads[i] = randn(size_t(sizes[i]), 50 * step + i);
        gg[i] = upload_shifted(grads[i], shift[i]);
        const int64_t s = shift[i];
        dev_ts.push_back({gp[i].data<float>() + s, gg[i].data<float>() + s, gm[i].data<float>() + s,
                          gv[i].data<float>() + s,
                          gcopy[i].defined() ? static_cast<char*>(gcopy[i].data()) + s * dtype_size(copy_dt) : nullptr,
                          sizes[i], host[i].wd});
        host_ts.push_back({host[i].p.data(), grads[i].data(), host[i].m.data(), host[i].v.data(), nullptr, sizes[i],
                           host[i].wd});
      }
      cuda::adamw_step(nullptr, dev_ts.data(), int(T), cfg, copy_dt);
      cpu::adamw_step(nullptr, host_ts.data(), int(T), cfg, copy_dt);
    }
    for (size_t i = 0; i < T; ++i) {
      SCOPED_TRACE("tensor " + std::to_string(i) + " n=" + std::to_string(sizes[i]));
      auto strip = [shift = shift[i]](const Tensor& t) {
        auto x = download(t);
        return std::vector<float>(x.begin() + shift, x.end());
      };
      auto p = strip(gp[i]);
      EXPECT_LE(max_scaled_diff(p, host[i].p), 1e-6);
      EXPECT_LE(max_scaled_diff(strip(gm[i]), host[i].m), 1e-6);
      EXPECT_LE(max_scaled_diff(strip(gv[i]), host[i].v), 1e-6);
      if (gcopy[i].defined()) {
        auto c = strip(gcopy[i]);
        EXPECT_EQ(c, round_to(p, copy_dt)) << "the copy must be the updated param rounded to the copy dtype";
      }
    }
  }
}

TEST(L2Norm, CpuHandChecked) {
  std::vector<float> a = {3.f, 4.f}, b = {1.f, -2.f, 2.f};
  const void* ptrs[] = {a.data(), b.data(), nullptr};
  const int64_t sizes[] = {2, 3, 0};
  float out = -1;
  cpu::l2norm_squared(nullptr, DType::F32, &out, ptrs, sizes, 3);
  EXPECT_EQ(out, 34.f);
  std::vector<bf16> h = {bf16(0.5f), bf16(-1.5f)};
  const void* hp[] = {h.data()};
  const int64_t hn[] = {2};
  cpu::l2norm_squared(nullptr, DType::BF16, &out, hp, hn, 1);
  EXPECT_EQ(out, 2.5f);
  cpu::l2norm_squared(nullptr, DType::F32, &out, ptrs, sizes, 0);
  EXPECT_EQ(out, 0.f);
}

TEST(L2Norm, CpuMatchesDoubleSumAndPropagatesNonFinite) {
  std::vector<std::vector<float>> xs;
  for (int i = 0; i < 20; ++i) xs.push_back(randn(size_t(1 + i * 37), 300 + i));
  std::vector<const void*> ptrs;
  std::vector<int64_t> sizes;
  double expected = 0;
  for (auto& x : xs) {
    ptrs.push_back(x.data());
    sizes.push_back(int64_t(x.size()));
    for (float v : x) expected += double(v) * v;
  }
  float out = 0;
  cpu::l2norm_squared(nullptr, DType::F32, &out, ptrs.data(), sizes.data(), int(xs.size()));
  EXPECT_NEAR(out, expected, 1e-6 * expected);
  xs[7][3] = std::numeric_limits<float>::infinity();
  cpu::l2norm_squared(nullptr, DType::F32, &out, ptrs.data(), sizes.data(), int(xs.size()));
  EXPECT_TRUE(std::isinf(out));
  xs[9][0] = std::numeric_limits<float>::quiet_NaN();
  cpu::l2norm_squared(nullptr, DType::F32, &out, ptrs.data(), sizes.data(), int(xs.size()));
  EXPECT_TRUE(std::isnan(out));
}

TEST(L2NormGpu, MatchesCpuDeterministicAndPropagatesNonFinite) {
  ZP_SKIP_WITHOUT_GPU();
  // Many tensors (more than one launch's batch), odd sizes, empty ones, one spanning many chunks.
  std::vector<int64_t> sizes = {1000003, 0, 1, 16384, 16385};
  for (int i = 0; i < 250; ++i) sizes.push_back((i * 104729) % 40000);
  for (DType dt : gpu_float_dtypes()) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    std::vector<std::vector<float>> xs;
    std::vector<Tensor> dev;
    std::vector<const void*> hptrs, dptrs;
    for (size_t i = 0; i < sizes.size(); ++i) {
      xs.push_back(round_to(randn(size_t(sizes[i]), 500 + i), dt));
      dev.push_back(upload(xs.back(), dt));
      hptrs.push_back(nullptr);
      dptrs.push_back(dev.back().data());
    }
    // The CPU reference reads fp32 copies of the dtype-rounded values.
    for (size_t i = 0; i < sizes.size(); ++i) hptrs[i] = xs[i].data();
    float expected = 0;
    cpu::l2norm_squared(nullptr, DType::F32, &expected, hptrs.data(), sizes.data(), int(sizes.size()));
    Tensor out = Tensor::empty({1}, DType::F32, Device::cuda());
    cuda::l2norm_squared(nullptr, dt, out.data<float>(), dptrs.data(), sizes.data(), int(sizes.size()));
    const float got = download(out)[0];
    EXPECT_NEAR(got, expected, 1e-5 * expected);
    cuda::l2norm_squared(nullptr, dt, out.data<float>(), dptrs.data(), sizes.data(), int(sizes.size()));
    EXPECT_EQ(download(out)[0], got) << "must be bitwise reproducible";

    // One inf anywhere (here deep inside the big tensor) makes the result inf; a nan makes it nan.
    Tensor big = dev[0];
    std::vector<float> inf_one = {std::numeric_limits<float>::infinity()};
    big.flat(777777, 1).copy_from(upload(inf_one, dt));
    cuda::l2norm_squared(nullptr, dt, out.data<float>(), dptrs.data(), sizes.data(), int(sizes.size()));
    EXPECT_TRUE(std::isinf(download(out)[0]));
    std::vector<float> nan_one = {std::numeric_limits<float>::quiet_NaN()};
    dev.back().flat(0, 1).copy_from(upload(nan_one, dt));
    if (sizes.back() > 0) {
      cuda::l2norm_squared(nullptr, dt, out.data<float>(), dptrs.data(), sizes.data(), int(sizes.size()));
      EXPECT_TRUE(std::isnan(download(out)[0]));
    }
    // No tensors at all: zero.
    cuda::l2norm_squared(nullptr, dt, out.data<float>(), dptrs.data(), sizes.data(), 0);
    EXPECT_EQ(download(out)[0], 0.f);
  }
}

}  // namespace zp::test
