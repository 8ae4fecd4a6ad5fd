// CPU AdamW, the optimizer of the CPU-offload tier as well as the reference. fp32 math in torch's order
// (scalars derived in double and rounded once, like torch's Python scalars).
//
// Vectorisation: a loop calling sqrtf does not vectorise while errno is live (-fmath-errno, the
// default), so each block of kBlock elements runs three loops: the moments (vectorised), the
// denominators (scalar sqrt, in L1), the parameter update (vectorised). target_clones compiles the
// block for AVX-512, AVX2 and the baseline and picks one at load time. The file builds with
// -ffp-contract=off (CMakeLists.txt): GCC would fuse multiply-adds in the AVX-512 clone, so results
// would depend on the CPU, and the offload tier's kernels/host AdamW is tested against these bits.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

#include "kernels/adamw.h"

namespace zp::kernels::cpu {
namespace {

constexpr int64_t kBlock = 256;
constexpr int64_t kChunk = int64_t(1) << 16;  // work unit handed to a thread

struct Consts {
  float grad_scale, one_minus_beta1, beta2, one_minus_beta2, neg_step_size, bias_correction2_sqrt, eps;
};

// torch's lerp: exact at both ends, stable for weights above and below 1/2.
inline float lerp(float a, float b, float w) { return w < 0.5f ? a + w * (b - a) : b - (b - a) * (1.f - w); }

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void update_block(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                  int64_t len, float decay, Consts k) {
  float denom[kBlock];
  for (int64_t i = 0; i < len; ++i) {
    float gi = g[i] * k.grad_scale;
    p[i] = p[i] * decay;
    m[i] = lerp(m[i], gi, k.one_minus_beta1);
    v[i] = v[i] * k.beta2;
    v[i] = v[i] + k.one_minus_beta2 * gi * gi;
  }
  for (int64_t i = 0; i < len; ++i) denom[i] = std::sqrt(v[i]) / k.bias_correction2_sqrt + k.eps;
  for (int64_t i = 0; i < len; ++i) p[i] = p[i] + k.neg_step_size * (m[i] / denom[i]);
}

template <class T> void write_copy(void* dst, const float* p, int64_t len) {
  T* d = static_cast<T*>(dst);
  for (int64_t i = 0; i < len; ++i) d[i] = T(p[i]);
}

}  // namespace

void adamw_step(StreamHandle, const AdamWTensor* tensors, int count, const AdamWConfig& cfg, DType copy_dt) {
  ZP_CHECK(count >= 0 && cfg.step >= 1, "step is 1-based");
  const double bias_correction1 = 1.0 - std::pow(cfg.beta1, double(cfg.step));
  const double bias_correction2 = 1.0 - std::pow(cfg.beta2, double(cfg.step));
  const Consts k = {cfg.grad_scale,
                    float(1.0 - cfg.beta1),
                    float(cfg.beta2),
                    float(1.0 - cfg.beta2),
                    float(-(cfg.lr / bias_correction1)),
                    float(std::sqrt(bias_correction2)),
                    float(cfg.eps)};

  // Work list of (tensor, offset) chunks, shared out to threads in order of an atomic counter.
  std::vector<std::pair<int, int64_t>> chunks;
  for (int t = 0; t < count; ++t) {
    ZP_CHECK(tensors[t].n >= 0);
    if (tensors[t].n > 0) ZP_CHECK(tensors[t].param && tensors[t].grad && tensors[t].exp_avg && tensors[t].exp_avg_sq);
    for (int64_t off = 0; off < tensors[t].n; off += kChunk) chunks.emplace_back(t, off);
  }
  auto run_chunk = [&](const std::pair<int, int64_t>& c) {
    const AdamWTensor& t = tensors[c.first];
    const float decay = float(1.0 - cfg.lr * double(t.weight_decay));
    const int64_t end = std::min(t.n, c.second + kChunk);
    for (int64_t i = c.second; i < end; i += kBlock) {
      int64_t len = std::min(kBlock, end - i);
      update_block(t.param + i, t.grad + i, t.exp_avg + i, t.exp_avg_sq + i, len, decay, k);
    }
    if (t.param_copy) {
      ZP_DISPATCH_FLOAT(copy_dt, T, [&] {
        write_copy<T>(static_cast<T*>(t.param_copy) + c.second, t.param + c.second, end - c.second);
      });
    }
  };

  const size_t threads = std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), chunks.size() / 4);
  if (threads <= 1) {
    for (const auto& c : chunks) run_chunk(c);
    return;
  }
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < chunks.size(); i = next++) run_chunk(chunks[i]);
  };
  std::vector<std::thread> pool;
  for (size_t i = 1; i < threads; ++i) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
}

}  // namespace zp::kernels::cpu
