#include "runtime/base_fingerprint.h"

#include <cstdio>
#include <cstring>

#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/elementwise.h"
#include "nn/init.h"

namespace zp::runtime {
namespace {

uint64_t mix(uint64_t h, uint64_t v) { return nn::splitmix64(h ^ v); }

uint64_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);  // round to nearest even, as every cast to bf16 here does
  return u >> 16;
}

}  // namespace

void BaseFingerprint::add(const nn::ParamBlock& b, StreamHandle s) {
  const Tensor host = b.values().device().is_cpu() ? b.values() : b.values().to(Device::cpu(), s);
  std::vector<float> f32(size_t(host.numel()));
  kernels::cpu::cast(nullptr, DType::F32, f32.data(), host.dtype(), host.data(), host.numel());
  const float* v = f32.data();
  for (const auto& p : b.params()) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (unsigned char c : p->name) h = (h ^ c) * 0x100000001B3ull;
    for (int64_t d : p->shape) h = mix(h, uint64_t(d));
    const int64_t n = p->numel();
    for (int64_t i = 0; i < n; i += kStride) h = mix(h, bf16_bits(v[p->offset + i]));
    if (n > 0) h = mix(h, bf16_bits(v[p->offset + n - 1]));
    h_ ^= h;
  }
}

std::string BaseFingerprint::hex() const {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h_));
  return buf;
}

BaseFingerprint BaseFingerprint::combined_over(MPI_Comm stages) const {
  uint64_t all = 0;
  ZP_MPI_CHECK(MPI_Allreduce(&h_, &all, 1, MPI_UINT64_T, MPI_BXOR, stages));
  BaseFingerprint f;
  f.h_ = all;
  return f;
}

}  // namespace zp::runtime
