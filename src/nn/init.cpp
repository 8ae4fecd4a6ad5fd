#include "nn/init.h"

#include <cmath>
#include <vector>

#include "kernels/elementwise.h"

namespace zp::nn {
namespace {

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
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t r = splitmix64(key + uint64_t(begin + i));
    // Box-Muller on the two 32-bit halves; u1 in (0, 1] so the log is finite.
    const double u1 = (double(r >> 32) + 1.0) / 4294967296.0, u2 = double(r & 0xffffffffu) / 4294967296.0;
    out[i] = float(std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
  }
}

void init_normal(Parameter& p, uint64_t seed, double std, StreamHandle s) {
  std::vector<float> host(size_t(p.numel()));
  counter_normal(seed, p.name, 0, p.numel(), std, host.data());
  upload(p, host, s);
}

void init_uniform(Parameter& p, uint64_t seed, double bound, StreamHandle s) {
  const uint64_t key = splitmix64(seed ^ fnv1a(p.name));
  std::vector<float> host(size_t(p.numel()));
  for (size_t i = 0; i < host.size(); ++i) {
    const double u = double(splitmix64(key + uint64_t(i)) >> 11) / 9007199254740992.0;  // [0, 1), 53 bits
    host[i] = float(bound * (2.0 * u - 1.0));
  }
  upload(p, host, s);
}

void init_constant(Parameter& p, float value, StreamHandle s) {
  upload(p, std::vector<float>(size_t(p.numel()), value), s);
}

}  // namespace zp::nn
