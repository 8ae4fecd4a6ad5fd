#include "nn/init.h"

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "core/cpu_share.h"
#include "kernels/elementwise.h"

namespace zp::nn {
namespace {

// fn(begin, end) over [0, n) in contiguous pieces on the rank's CPUs. A draw costs a log, a square
// root and a cosine in double precision (~25 ns), so one thread initialised a 1.3B-parameter model in
// about 50 s; every element depends only on its index, so the pieces give the same values.
template <class Fn>
void for_pieces(int64_t n, Fn fn) {
  constexpr int64_t kMinPiece = int64_t(1) << 18;
  const int64_t threads =
      std::clamp<int64_t>(int64_t(thread_cpus().size()), 1, std::max<int64_t>(1, n / kMinPiece));
  if (threads == 1) {
    fn(int64_t(0), n);
    return;
  }
  std::vector<std::jthread> pool;
  for (int64_t t = 0; t < threads; ++t)
    pool.emplace_back([&fn, n, threads, t] { fn(n * t / threads, n * (t + 1) / threads); });
}

void upload(Parameter& p, const std::vector<float>& host, StreamHandle s) {
  Tensor f32 = Tensor::from_blob(const_cast<float*>(host.data()), p.shape, DType::F32, Device::cpu());
  if (p.value.dtype() == DType::F32) {
    p.value.copy_from(f32, s);
    return;
  }
  Tensor conv = Tensor::empty(p.shape, p.value.dtype(), Device::cpu(), "init");
  kernels::cpu::cast(nullptr, p.value.dtype(), conv.data(), DType::F32, host.data(), p.numel());
  p.value.copy_from(conv, s);
}

}  // namespace

void counter_normal(uint64_t seed, const std::string& name, int64_t begin, int64_t count, double std, float* out) {
  const uint64_t key = splitmix64(seed ^ fnv1a(name));
  for_pieces(count, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const uint64_t r = splitmix64(key + uint64_t(begin + i));
      // Box-Muller on the two 32-bit halves; u1 in (0, 1] so the log is finite.
      const double u1 = (double(r >> 32) + 1.0) / 4294967296.0, u2 = double(r & 0xffffffffu) / 4294967296.0;
      out[i] = float(std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
    }
  });
}

void init_normal(Parameter& p, uint64_t seed, double std, StreamHandle s) {
  std::vector<float> host(size_t(p.numel()));
  counter_normal(seed, p.name, 0, p.numel(), std, host.data());
  upload(p, host, s);
}

void init_uniform(Parameter& p, uint64_t seed, double bound, StreamHandle s) {
  const uint64_t key = splitmix64(seed ^ fnv1a(p.name));
  std::vector<float> host(size_t(p.numel()));
  for_pieces(p.numel(), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const double u = double(splitmix64(key + uint64_t(i)) >> 11) / 9007199254740992.0;  // [0, 1), 53 bits
      host[size_t(i)] = float(bound * (2.0 * u - 1.0));
    }
  });
  upload(p, host, s);
}

void init_constant(Parameter& p, float value, StreamHandle s) {
  upload(p, std::vector<float>(size_t(p.numel()), value), s);
}

}  // namespace zp::nn
