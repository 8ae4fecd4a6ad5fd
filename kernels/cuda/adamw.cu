// Multi-tensor AdamW: one launch updates up to kMaxTensors tensors. The tensor table travels as a
// __grid_constant__ kernel parameter (no upload, nothing to keep alive after the launch); every
// block owns one kChunk-element chunk of one tensor and finds it by binary search over the table's
// chunk offsets. Tensors whose pointers are all 16-byte aligned use float4 loads and stores.
#include <climits>
#include <cmath>

#include "kernels/adamw.h"
#include "kernels/cuda/cuda_common.cuh"

namespace zp::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 16384;  // elements per block (a multiple of 4, so chunks keep float4 alignment)
constexpr int kMaxTensors = 48;    // keeps the parameter struct under the classic 4 KB limit

struct Entry {
  float* p;
  const float* g;
  float* m;
  float* v;
  void* copy;
  int64_t n;
  float decay;  // 1 - lr * weight_decay
  bool vec;     // float4 path allowed
};
struct Batch {
  Entry t[kMaxTensors];
  int64_t first_chunk[kMaxTensors];
  int count;
};
struct Consts {
  float grad_scale, one_minus_beta1, beta2, one_minus_beta2, neg_step_size, bias_correction2_sqrt, eps;
};

// One element, in torch's order (see adamw.h); returns the new parameter.
__device__ __forceinline__ float update(float p, float g, float& m, float& v, float decay, const Consts& k) {
  g *= k.grad_scale;
  p *= decay;
  const float w = k.one_minus_beta1;
  m = w < 0.5f ? m + w * (g - m) : g - (g - m) * (1.f - w);  // torch's lerp
  v = v * k.beta2;
  v = v + k.one_minus_beta2 * g * g;
  const float denom = sqrtf(v) / k.bias_correction2_sqrt + k.eps;
  return p + k.neg_step_size * (m / denom);
}

template <class C> struct alignas(4 * sizeof(C)) Pack4 { C x[4]; };

template <class C>
__global__ void __launch_bounds__(kThreads) adamw_kernel(const __grid_constant__ Batch b, Consts k) {
  const int64_t block = blockIdx.x;
  int lo = 0, hi = b.count - 1;  // the last tensor whose first chunk is <= this block
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (b.first_chunk[mid] <= block) lo = mid;
    else hi = mid - 1;
  }
  const Entry& e = b.t[lo];
  const int64_t start = (block - b.first_chunk[lo]) * kChunk;
  const int64_t len = min(kChunk, e.n - start);
  float* p = e.p + start;
  const float* g = e.g + start;
  float* m = e.m + start;
  float* v = e.v + start;
  C* copy = e.copy ? static_cast<C*>(e.copy) + start : nullptr;

  int64_t scalar_from = 0;
  if (e.vec) {
    const int64_t nvec = len / 4;
    for (int64_t i = threadIdx.x; i < nvec; i += kThreads) {
      float4 pv = reinterpret_cast<const float4*>(p)[i];
      float4 gv = reinterpret_cast<const float4*>(g)[i];
      float4 mv = reinterpret_cast<const float4*>(m)[i];
      float4 vv = reinterpret_cast<const float4*>(v)[i];
      pv.x = update(pv.x, gv.x, mv.x, vv.x, e.decay, k);
      pv.y = update(pv.y, gv.y, mv.y, vv.y, e.decay, k);
      pv.z = update(pv.z, gv.z, mv.z, vv.z, e.decay, k);
      pv.w = update(pv.w, gv.w, mv.w, vv.w, e.decay, k);
      reinterpret_cast<float4*>(p)[i] = pv;
      reinterpret_cast<float4*>(m)[i] = mv;
      reinterpret_cast<float4*>(v)[i] = vv;
      if (copy) {
        Pack4<C> c;
        c.x[0] = from_f<C>(pv.x);
        c.x[1] = from_f<C>(pv.y);
        c.x[2] = from_f<C>(pv.z);
        c.x[3] = from_f<C>(pv.w);
        reinterpret_cast<Pack4<C>*>(copy)[i] = c;
      }
    }
    scalar_from = nvec * 4;
  }
  for (int64_t i = scalar_from + threadIdx.x; i < len; i += kThreads) {
    float mi = m[i], vi = v[i];
    float pi = update(p[i], g[i], mi, vi, e.decay, k);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (copy) copy[i] = from_f<C>(pi);
  }
}

bool aligned(const void* ptr, size_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

}  // namespace

void adamw_step(StreamHandle s, const AdamWTensor* tensors, int count, const AdamWConfig& cfg, DType copy_dt) {
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
  bool any_copy = false;
  for (int t = 0; t < count; ++t) any_copy |= tensors[t].n > 0 && tensors[t].param_copy != nullptr;
  const DType launch_dt = any_copy ? copy_dt : DType::F32;  // without copies the copy type is irrelevant
  const size_t copy_size = dtype_size(launch_dt);

  Batch b{};
  int64_t batch_chunks = 0;
  auto flush = [&] {
    if (b.count == 0) return;
    ZP_CUDA_DISPATCH_FLOAT(launch_dt, C, [&] { adamw_kernel<C><<<unsigned(batch_chunks), kThreads, 0, s>>>(b, k); });
    ZP_CUDA_LAUNCH_CHECK();
    b.count = 0;
    batch_chunks = 0;
  };
  for (int i = 0; i < count; ++i) {
    const AdamWTensor& t = tensors[i];
    ZP_CHECK(t.n >= 0);
    if (t.n == 0) continue;
    ZP_CHECK(t.param && t.grad && t.exp_avg && t.exp_avg_sq);
    const int64_t chunks = (t.n + kChunk - 1) / kChunk;
    if (b.count == kMaxTensors || batch_chunks + chunks >= INT_MAX) flush();
    Entry& e = b.t[b.count];
    e = {t.param, t.grad, t.exp_avg, t.exp_avg_sq, t.param_copy, t.n, float(1.0 - cfg.lr * double(t.weight_decay)),
         aligned(t.param, 16) && aligned(t.grad, 16) && aligned(t.exp_avg, 16) && aligned(t.exp_avg_sq, 16) &&
             (!t.param_copy || aligned(t.param_copy, 4 * copy_size))};
    b.first_chunk[b.count] = batch_chunks;
    ++b.count;
    batch_chunks += chunks;
  }
  flush();
}

}  // namespace zp::kernels::cuda
