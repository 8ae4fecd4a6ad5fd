// Shared helpers for the tests: random inputs, dtype rounding, device transfer, relative error,
// finite-difference gradient checks and the GPU skip.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <functional>
#include <random>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

namespace zp::test {

#define ZP_SKIP_WITHOUT_GPU()                                                   \
  do {                                                                          \
    if (::zp::cuda_device_count() == 0) GTEST_SKIP() << ::zp::cuda_unavailable_reason(); \
  } while (0)

inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.f, float mean = 0.f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(mean, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
inline std::vector<float> randu(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// The values as the given dtype stores them (so CPU reference and GPU see identical inputs).
inline std::vector<float> round_to(const std::vector<float>& v, DType dt) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::BF16) r[i] = float(bf16(v[i]));
    else if (dt == DType::F16) r[i] = float(f16(v[i]));
    else r[i] = v[i];
  }
  return r;
}

// Host float values -> tensor of `dt` on `dev` (cuda:0 by default).
inline Tensor upload(const std::vector<float>& v, DType dt, Device dev = Device::cuda(0)) {
  Tensor h = Tensor::empty({int64_t(v.size())}, dt, Device::cpu());
  for (size_t i = 0; i < v.size(); ++i) {
    switch (dt) {
      case DType::F32: h.data<float>()[i] = v[i]; break;
      case DType::BF16: h.data<bf16>()[i] = bf16(v[i]); break;
      case DType::F16: h.data<f16>()[i] = f16(v[i]); break;
      case DType::F64: h.data<double>()[i] = v[i]; break;
      case DType::I32: h.data<int32_t>()[i] = int32_t(v[i]); break;
      case DType::I64: h.data<int64_t>()[i] = int64_t(v[i]); break;
      case DType::U8: h.data<uint8_t>()[i] = uint8_t(v[i]); break;
    }
  }
  return dev.is_cpu() ? h : h.to(dev);
}

// Any float tensor -> host floats.
inline std::vector<float> download(const Tensor& t) {
  Tensor h = t.device().is_cpu() ? t : t.to(Device::cpu());
  std::vector<float> v(size_t(h.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    switch (h.dtype()) {
      case DType::F32: v[i] = h.data<float>()[i]; break;
      case DType::BF16: v[i] = float(h.data<bf16>()[i]); break;
      case DType::F16: v[i] = float(h.data<f16>()[i]); break;
      case DType::F64: v[i] = float(h.data<double>()[i]); break;
      case DType::I32: v[i] = float(h.data<int32_t>()[i]); break;
      case DType::I64: v[i] = float(h.data<int64_t>()[i]); break;
      case DType::U8: v[i] = float(h.data<uint8_t>()[i]); break;
    }
  }
  return v;
}

// ||a - b|| / ||b|| (absolute ||a - b|| when b is all zeros).
template <class A, class B>
double rel_error(const std::vector<A>& a, const std::vector<B>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  if (!std::isfinite(num)) return INFINITY;
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Tolerance for a CUDA result against the CPU reference (relative L2 error), by compute dtype.
inline double tolerance(DType dt) {
  switch (dt) {
    case DType::BF16: return 2e-2;
    case DType::F16: return 5e-3;
    default: return 1e-5;
  }
}

// Checks an analytic gradient against central differences of `loss` (evaluated in double).
// Perturbs up to `max_checks` evenly spread entries of `x`; compares those entries as a vector.
inline void expect_grad_matches_fd(std::vector<double>& x, const std::vector<double>& grad,
                                   const std::function<double()>& loss, const char* what,
                                   double eps = 1e-6, double tol = 1e-6, size_t max_checks = 96) {
  ASSERT_EQ(x.size(), grad.size()) << what;
  size_t step = x.size() <= max_checks ? 1 : x.size() / max_checks;
  std::vector<double> fd, an;
  for (size_t i = 0; i < x.size(); i += step) {
    double keep = x[i];
    x[i] = keep + eps;
    double lp = loss();
    x[i] = keep - eps;
    double lm = loss();
    x[i] = keep;
    fd.push_back((lp - lm) / (2 * eps));
    an.push_back(grad[i]);
  }
  EXPECT_LE(rel_error(an, fd), tol) << what << ": analytic gradient differs from finite differences";
}

// Path of a file under the reference dumps (tests/golden in the checkout; the ZP_GOLDEN_DIR
// environment variable overrides). A missing one throws, which fails the test: the dumps ship with
// the project, so a test that cannot find them is broken, never "not applicable".
inline std::string golden_path(const std::string& rel) {
  const char* env = std::getenv("ZP_GOLDEN_DIR");
#ifdef ZP_GOLDEN_DIR
  const std::string base = env ? env : ZP_GOLDEN_DIR;
#else
  const std::string base = env ? env : "";
#endif
  const std::string p = base + "/" + rel;
  if (base.empty() || !std::filesystem::exists(p))
    throw std::runtime_error("reference dump file '" + rel + "' not found under '" + base +
                             "' (tests/golden in the checkout; ZP_GOLDEN_DIR overrides)");
  return p;
}

inline const std::vector<DType>& gpu_float_dtypes() {
  static const std::vector<DType> d = {DType::F32, DType::BF16, DType::F16};
  return d;
}

// Runs `f`, expecting a zp::Error whose message contains every fragment.
template <class F> void expect_error(F&& f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << fragments.front();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& frag : fragments) EXPECT_NE(msg.find(frag), std::string::npos) << "'" << frag << "' not in: " << msg;
  }
}

// The message of the zp::Error `f` throws; "" when it throws none.
inline std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// An activation estimate against the bytes a step really kept: within a factor of two either way (an
// estimate plans memory, it is not a measurement). Prints both, for the log.
inline void expect_estimate_within_twice(const std::string& what, double estimate, double measured) {
  EXPECT_GE(estimate, measured / 2) << what << ": estimate " << estimate << ", measured " << measured;
  EXPECT_LE(estimate, measured * 2) << what << ": estimate " << estimate << ", measured " << measured;
  std::printf("%s: activations estimated %.0f bytes, kept %.0f\n", what.c_str(), estimate, measured);
}

// A fresh folder <temp>/zp_<name>_<pid> (so parallel test binaries cannot collide), removed with
// everything in it when the object goes.
class ScratchFolder {
 public:
  explicit ScratchFolder(const std::string& name)
      : path_(std::filesystem::temp_directory_path() / ("zp_" + name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchFolder() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchFolder(const ScratchFolder&) = delete;
  ScratchFolder& operator=(const ScratchFolder&) = delete;
  std::string operator/(const std::string& f) const { return (path_ / f).string(); }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace zp::test
