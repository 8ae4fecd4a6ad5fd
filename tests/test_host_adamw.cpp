// The offload tier's vectorised AdamW (kernels/host) against the reference cpu::adamw_step, bit for bit,
// on every instruction set this CPU has: odd sizes, unaligned starts, several tensors per call, several
// steps, every copy dtype; and its thread pool used from other threads.
#include <cstring>
#include <limits>
#include <thread>

#include "kernels/adamw.h"
#include "kernels/host/host_adamw.h"
#include "test_util.h"

namespace zp::test {
using namespace zp::kernels;
using host::HostAdamW;
using host::Isa;

namespace {

// One tensor's state, `shift` floats into its buffers so that most starts are not 16-byte aligned.
struct State {
  int64_t n = 0, shift = 0;
  float wd = 0;
  std::vector<float> p, m, v;
  std::vector<uint8_t> copy;  // shift + n elements of the copy dtype; empty = no copy
  float* param() { return p.data() + shift; }
  float* exp_avg() { return m.data() + shift; }
  float* exp_avg_sq() { return v.data() + shift; }
  void* param_copy(DType dt) { return copy.empty() ? nullptr : copy.data() + shift * dtype_size(dt); }
};

// Parameters spread over 2^-22 .. 2^17, so the f16 copy meets subnormals and overflow to inf.
State make_state(int64_t n, int64_t shift, float wd, bool with_copy, DType dt, uint64_t seed) {
  State s;
  s.n = n;
  s.shift = shift;
  s.wd = wd;
  s.p = randn(size_t(n + shift), seed);
  for (int64_t i = 0; i < n + shift; ++i) s.p[size_t(i)] = std::ldexp(s.p[size_t(i)], int((i * 7) % 40) - 22);
  s.m = randn(size_t(n + shift), seed + 1, 0.01f);
  s.v = randu(size_t(n + shift), seed + 2, 0.f, 1e-4f);
  if (with_copy) s.copy.assign(size_t(n + shift) * dtype_size(dt), 0);
  return s;
}

std::vector<AdamWTensor> tensors_of(std::vector<State>& st, const std::vector<std::vector<float>>& grads, DType dt) {
  std::vector<AdamWTensor> ts;
  for (size_t i = 0; i < st.size(); ++i)
    ts.push_back({st[i].param(), grads[i].data() + st[i].shift, st[i].exp_avg(), st[i].exp_avg_sq(),
                  st[i].param_copy(dt), st[i].n, st[i].wd});
  return ts;
}

// Index of the first element whose bits differ (two NaNs count as equal: which operand's NaN an
// instruction propagates depends on operand order, which the compiler may choose), or -1.
int64_t first_difference(const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(&a[i], &b[i], 4) != 0) return i;
  }
  return -1;
}
int64_t first_difference16(const uint16_t* a, const uint16_t* b, int64_t n, DType dt) {
  auto is_nan = [dt](uint16_t h) { return dt == DType::BF16 ? std::isnan(float(bf16::from_bits(h)))
                                                            : std::isnan(float(f16::from_bits(h))); };
  for (int64_t i = 0; i < n; ++i)
    if (a[i] != b[i] && !(is_nan(a[i]) && is_nan(b[i]))) return i;
  return -1;
}

void expect_same(State& ours, State& ref, DType dt) {
  const std::string where = "n=" + std::to_string(ours.n) + " shift=" + std::to_string(ours.shift);
  EXPECT_EQ(first_difference(ours.param(), ref.param(), ours.n), -1) << "param " << where;
  EXPECT_EQ(first_difference(ours.exp_avg(), ref.exp_avg(), ours.n), -1) << "exp_avg " << where;
  EXPECT_EQ(first_difference(ours.exp_avg_sq(), ref.exp_avg_sq(), ours.n), -1) << "exp_avg_sq " << where;
  if (ours.copy.empty()) return;
  if (dt == DType::F32) {
    EXPECT_EQ(first_difference(static_cast<float*>(ours.param_copy(dt)), static_cast<float*>(ref.param_copy(dt)),
                               ours.n), -1) << "copy " << where;
  } else {
    EXPECT_EQ(first_difference16(static_cast<uint16_t*>(ours.param_copy(dt)),
                                 static_cast<uint16_t*>(ref.param_copy(dt)), ours.n, dt), -1) << "copy " << where;
  }
  // The padding before the range is untouched.
  for (int64_t i = 0; i < ours.shift * int64_t(dtype_size(dt)); ++i) ASSERT_EQ(ours.copy[size_t(i)], 0) << where;
}

// Runs `steps` steps on both implementations from identical states and compares every array.
void check_against_reference(HostAdamW& opt, Isa isa, DType dt, AdamWConfig cfg, int steps,
                             const std::vector<int64_t>& sizes, uint64_t seed,
                             const std::function<void(std::vector<float>&, int)>& edit_grad = {}) {
  std::vector<State> ours, ref;
  for (size_t i = 0; i < sizes.size(); ++i) {
    // Shifts 0..3 floats; every other tensor has a copy; weight decays differ per tensor.
    ours.push_back(make_state(sizes[i], int64_t(i % 4), 0.01f * float(i % 3), i % 2 == 0, dt, seed + 10 * i));
    ref.push_back(ours.back());
  }
  for (int step = 1; step <= steps; ++step) {
    cfg.step = step;
    std::vector<std::vector<float>> grads;
    for (size_t i = 0; i < sizes.size(); ++i) {
      grads.push_back(randn(size_t(sizes[i] + ours[i].shift), seed + 1000 * step + i, 0.3f));
      if (edit_grad) edit_grad(grads.back(), step);
    }
    auto ts_ours = tensors_of(ours, grads, dt);
    auto ts_ref = tensors_of(ref, grads, dt);
    opt.step(ts_ours.data(), int(ts_ours.size()), cfg, dt, isa);
    cpu::adamw_step(nullptr, ts_ref.data(), int(ts_ref.size()), cfg, dt);
  }
  for (size_t i = 0; i < sizes.size(); ++i) expect_same(ours[i], ref[i], dt);
}

AdamWConfig test_config() {
  AdamWConfig cfg;
  cfg.lr = 3e-3;
  cfg.beta1 = 0.9;
  cfg.beta2 = 0.95;
  cfg.eps = 1e-8;
  cfg.grad_scale = 0.37f;
  return cfg;
}

const std::vector<int64_t> kOddSizes = {0, 1, 7, 15, 17, 31, 33, 1000003};

}  // namespace

TEST(HostAdamW, IsaDetection) {
  const auto isas = host::supported_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), Isa::Scalar);
  EXPECT_EQ(isas.back(), host::best_isa());
  for (Isa isa : isas) EXPECT_TRUE(host::isa_supported(isa)) << host::isa_name(isa);
  EXPECT_STREQ(host::isa_name(Isa::Avx512), "avx512");
  // The ones this CPU has, as the kernel and the compiler's runtime see them.
  EXPECT_EQ(host::isa_supported(Isa::Avx512), bool(__builtin_cpu_supports("avx512f")));
  EXPECT_EQ(host::isa_supported(Isa::Avx2), __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"));
}

TEST(HostAdamW, MatchesReferenceBitwiseEveryIsaAndCopyDtype) {
  HostAdamW opt(4);  // more threads than this machine may have: the pool must not care
  for (Isa isa : host::supported_isas()) {
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      SCOPED_TRACE(std::string(host::isa_name(isa)) + " copy " + std::string(dtype_name(dt)));
      check_against_reference(opt, isa, dt, test_config(), 3, kOddSizes, 7);
    }
  }
}

TEST(HostAdamW, MatchesReferenceWithBeta1BelowHalf) {
  // 1 - beta1 >= 0.5 takes lerp's other formula.
  AdamWConfig cfg = test_config();
  cfg.beta1 = 0.3;
  cfg.grad_scale = 1.f;
  HostAdamW opt(2);
  for (Isa isa : host::supported_isas()) {
    SCOPED_TRACE(host::isa_name(isa));
    check_against_reference(opt, isa, DType::BF16, cfg, 2, {33, 100001}, 11);
  }
}

TEST(HostAdamW, MatchesReferenceOnInfAndNanGradients) {
  // Overflowed fp16 gradients reach the optimizer only when overflow skipping is off, but whatever
  // reaches it must come out as the reference's would.
  auto poison = [](std::vector<float>& g, int step) {
    for (size_t i = 0; i < g.size(); i += 13) g[i] = (i / 13) % 3 == 0 ? std::numeric_limits<float>::infinity()
                                                   : (i / 13) % 3 == 1 ? -std::numeric_limits<float>::infinity()
                                                                       : std::numeric_limits<float>::quiet_NaN();
    if (step == 2 && g.size() > 5) g[5] = 3e38f;
  };
  HostAdamW opt(2);
  for (Isa isa : host::supported_isas()) {
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      SCOPED_TRACE(std::string(host::isa_name(isa)) + " copy " + std::string(dtype_name(dt)));
      check_against_reference(opt, isa, dt, test_config(), 2, {1, 17, 33, 1001}, 23, poison);
    }
  }
}

TEST(HostAdamW, StepFromAnotherThreadAndTwoOptimizersAtOnce) {
  // The engine calls step() from its own worker thread while the main thread drives the GPU; two
  // engines in one process (two HostAdamW) run side by side.
  HostAdamW a(2), b(2);
  const AdamWConfig cfg = test_config();
  std::thread ta([&] { check_against_reference(a, host::best_isa(), DType::BF16, cfg, 2, {1000003, 9}, 31); });
  std::thread tb([&] { check_against_reference(b, Isa::Scalar, DType::F16, cfg, 2, {777777, 5}, 37); });
  ta.join();
  tb.join();
}

TEST(HostAdamW, ConcurrentStepsOnOneObjectAreSerialised) {
  HostAdamW opt(3);
  std::vector<std::thread> ts;
  for (int i = 0; i < 3; ++i)
    ts.emplace_back([&, i] {
      check_against_reference(opt, host::best_isa(), DType::F32, test_config(), 2, {500001, 3}, 41 + uint64_t(i));
    });
  for (auto& t : ts) t.join();
}

TEST(HostThreadPool, RunsEveryWorkerOnceAndRethrows) {
  host::ThreadPool pool(3);
  ASSERT_EQ(pool.size(), 3);
  for (int round = 0; round < 50; ++round) {
    std::vector<int> hits(3, 0);
    pool.run([&](int w) { hits[size_t(w)] += 1; });
    EXPECT_EQ(hits, std::vector<int>({1, 1, 1})) << "round " << round;
  }
  EXPECT_THROW(pool.run([](int w) { if (w == 2) throw Error("worker 2 failed"); }), Error);
  int after = 0;
  pool.run([&](int w) { if (w == 0) after = 1; });  // still usable after an exception
  EXPECT_EQ(after, 1);
  host::ThreadPool single(1);
  EXPECT_EQ(single.size(), 1);
}

}  // namespace zp::test
