// HostAdamW: run-time ISA choice, the scalar path, and the split of a step into chunks for the pool.
// The vector paths live in host_adamw_avx2.cpp and host_adamw_avx512.cpp, whose functions carry
// target attributes so that only they use the wider instructions.
#include "kernels/host/host_adamw.h"

#include <algorithm>
#include <atomic>
#include <cmath>

namespace zp::kernels::host {

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return true;
    case Isa::Avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    case Isa::Avx512: return __builtin_cpu_supports("avx512f");
  }
  return false;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512})
    if (isa_supported(isa)) out.push_back(isa);
  return out;
}

Isa best_isa() { return supported_isas().back(); }

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "?";
}

namespace detail {

// The same derivation as kernels/cpu/adamw.cpp: in double, each rounded to float once.
Consts consts_of(const AdamWConfig& cfg) {
  const double bias_correction1 = 1.0 - std::pow(cfg.beta1, double(cfg.step));
  const double bias_correction2 = 1.0 - std::pow(cfg.beta2, double(cfg.step));
  const float one_minus_beta1 = float(1.0 - cfg.beta1);
  return {cfg.grad_scale,
          one_minus_beta1,
          1.f - one_minus_beta1,  // in float, as the reference's lerp computes it
          float(cfg.beta2),
          float(1.0 - cfg.beta2),
          float(-(cfg.lr / bias_correction1)),
          float(std::sqrt(bias_correction2)),
          float(cfg.eps)};
}

template <class T> static void update_scalar_as(const Range& r, const Consts& k) {
  T* copy = static_cast<T*>(r.copy);
  for (int64_t i = 0; i < r.n; ++i) {
    const float g = r.g[i] * k.grad_scale;
    float p = r.p[i] * r.decay;
    float m = r.m[i];
    m = k.one_minus_beta1 < 0.5f ? m + k.one_minus_beta1 * (g - m) : g - (g - m) * k.one_minus_w;
    float v = r.v[i] * k.beta2;
    v = v + k.one_minus_beta2 * g * g;
    const float denom = std::sqrt(v) / k.bias_correction2_sqrt + k.eps;
    p = p + k.neg_step_size * (m / denom);
    r.p[i] = p;
    r.m[i] = m;
    r.v[i] = v;
    if (copy) copy[i] = T(p);
  }
}

void update_scalar(const Range& r, const Consts& k, DType copy_dt) {
  switch (copy_dt) {
    case DType::F32: return update_scalar_as<float>(r, k);
    case DType::BF16: return update_scalar_as<bf16>(r, k);
    case DType::F16: return update_scalar_as<f16>(r, k);
    default: ZP_FATAL("HostAdamW: copy dtype ", dtype_name(copy_dt), " is not f32, bf16 or f16");
  }
}

}  // namespace detail

HostAdamW::HostAdamW(int threads) : pool_(threads) {}

void HostAdamW::step(const AdamWTensor* tensors, int count, const AdamWConfig& cfg, DType copy_dt, Isa isa) {
  // A chunk is what one thread takes at a time: large enough that taking it costs nothing, small
  // enough that the threads finish together. A multiple of 16 so only a tensor's last chunk has a tail.
  constexpr int64_t kChunk = int64_t(1) << 15;
  ZP_CHECK(count >= 0 && cfg.step >= 1, "step is 1-based");
  ZP_CHECK(copy_dt == DType::F32 || copy_dt == DType::BF16 || copy_dt == DType::F16, "copy dtype ",
           dtype_name(copy_dt));
  ZP_CHECK(isa_supported(isa), "this CPU has no ", isa_name(isa));
  const detail::Consts k = detail::consts_of(cfg);
  auto update = isa == Isa::Avx512 ? detail::update_avx512 : isa == Isa::Avx2 ? detail::update_avx2
                                                                                : detail::update_scalar;

  std::lock_guard<std::mutex> lock(mutex_);
  chunks_.clear();
  int64_t total = 0;
  for (int t = 0; t < count; ++t) {
    const AdamWTensor& x = tensors[t];
    ZP_CHECK(x.n >= 0);
    if (x.n > 0) ZP_CHECK(x.param && x.grad && x.exp_avg && x.exp_avg_sq);
    for (int64_t b = 0; b < x.n; b += kChunk) chunks_.push_back({t, b, std::min(x.n, b + kChunk)});
    total += x.n;
  }
  const size_t elem_copy = dtype_size(copy_dt);
  auto run_chunk = [&](const Chunk& c) {
    const AdamWTensor& x = tensors[c.tensor];
    void* copy = x.param_copy ? static_cast<char*>(x.param_copy) + c.begin * elem_copy : nullptr;
    update({x.param + c.begin, x.grad + c.begin, x.exp_avg + c.begin, x.exp_avg_sq + c.begin, copy,
            c.end - c.begin, float(1.0 - cfg.lr * double(x.weight_decay))},
           k, copy_dt);
  };
  // Waking the pool costs tens of microseconds: a small step runs on the calling thread alone.
  if (pool_.size() == 1 || total < 4 * kChunk) {
    for (const Chunk& c : chunks_) run_chunk(c);
    return;
  }
  std::atomic<size_t> next{0};
  pool_.run([&](int) {
    for (size_t i = next++; i < chunks_.size(); i = next++) run_chunk(chunks_[i]);
  });
}

}  // namespace zp::kernels::host
