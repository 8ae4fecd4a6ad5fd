// Pointwise activations. One generic kernel serves every op: an op is a small functor that maps up
// to 3 fp32 inputs to up to 2 fp32 outputs, and the kernel moves 16 bytes per operand per step when
// every pointer (and, for the packed [rows, 2D] layouts, every row start) is 16-byte aligned; else
// it falls back to one element per step. The packed gated units are the same functors reading two
// column halves of one row: operand k of element (r, c) lives at ptr[k] + r * ld[k] + c.
#include <cstdint>
#include <initializer_list>

#include "kernels/activation.h"
#include "kernels/cuda/cuda_common.cuh"

namespace zp::kernels::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608f;
constexpr float kInvSqrt2 = 0.7071067812f;
constexpr float kInvSqrt2Pi = 0.3989422804f;
constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ float gelu_tanh(float x) {
  return 0.5f * x * (1.f + tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x)));
}
__device__ __forceinline__ float gelu_tanh_grad(float x) {
  float t = tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
  return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * kSqrt2OverPi * (1.f + 3.f * kGeluCubic * x * x);
}
__device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.f + erff(x * kInvSqrt2)); }
__device__ __forceinline__ float gelu_erf_grad(float x) {
  return 0.5f * (1.f + erff(x * kInvSqrt2)) + x * kInvSqrt2Pi * expf(-0.5f * x * x);
}
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float silu_grad_from_sigmoid(float x, float sg) { return sg * (1.f + x * (1.f - sg)); }

// Functors: kIn inputs -> kOut outputs.
struct GeluTanhFwd {
  static constexpr int kIn = 1, kOut = 1;
  __device__ void operator()(const float* in, float* out) const { out[0] = gelu_tanh(in[0]); }
};
struct GeluErfFwd {
  static constexpr int kIn = 1, kOut = 1;
  __device__ void operator()(const float* in, float* out) const { out[0] = gelu_erf(in[0]); }
};
struct GeluTanhBwd {  // (dy, x) -> dx
  static constexpr int kIn = 2, kOut = 1;
  __device__ void operator()(const float* in, float* out) const { out[0] = in[0] * gelu_tanh_grad(in[1]); }
};
struct GeluErfBwd {
  static constexpr int kIn = 2, kOut = 1;
  __device__ void operator()(const float* in, float* out) const { out[0] = in[0] * gelu_erf_grad(in[1]); }
};
struct SiluFwd {
  static constexpr int kIn = 1, kOut = 1;
  __device__ void operator()(const float* in, float* out) const { out[0] = in[0] * sigmoid(in[0]); }
};
struct SiluBwd {  // (dy, x) -> dx
  static constexpr int kIn = 2, kOut = 1;
  __device__ void operator()(const float* in, float* out) const {
    out[0] = in[0] * silu_grad_from_sigmoid(in[1], sigmoid(in[1]));
  }
};
struct SwigluFwd {  // (gate, up) -> y
  static constexpr int kIn = 2, kOut = 1;
  __device__ void operator()(const float* in, float* out) const { out[0] = in[0] * sigmoid(in[0]) * in[1]; }
};
struct SwigluBwd {  // (dy, gate, up) -> (dgate, dup)
  static constexpr int kIn = 3, kOut = 2;
  __device__ void operator()(const float* in, float* out) const {
    float sg = sigmoid(in[1]);
    out[0] = in[0] * in[2] * silu_grad_from_sigmoid(in[1], sg);
    out[1] = in[0] * in[1] * sg;
  }
};
struct GegluFwd {  // (hidden, gate) -> y
  static constexpr int kIn = 2, kOut = 1;
  __device__ void operator()(const float* in, float* out) const { out[0] = in[0] * gelu_erf(in[1]); }
};
struct GegluBwd {  // (dy, hidden, gate) -> (dhidden, dgate)
  static constexpr int kIn = 3, kOut = 2;
  __device__ void operator()(const float* in, float* out) const {
    out[0] = in[0] * gelu_erf(in[2]);
    out[1] = in[0] * in[1] * gelu_erf_grad(in[2]);
  }
};

template <class T>
struct Operands {
  const T* in[3] = {};
  int64_t in_ld[3] = {};
  T* out[2] = {};
  int64_t out_ld[2] = {};
};

template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// Elements [0, n) of a logical [n / D, D] array; kFlat means every operand is contiguous (ld == D),
// which skips the index division. The last n % V elements (kFlat only) are done one per thread.
template <int V, bool kFlat, class T, class Op>
__global__ void map_kernel(Op op, Operands<T> o, int64_t n, int64_t D) {
  pdl_launch_dependents();  // the next kernel of a decode step may start (cuda_common.cuh)
  pdl_wait();               // launched as a dependent of the kernel ahead (launch_dependent)
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t npack = n / V;
  for (int64_t p = tid; p < npack; p += stride) {
    const int64_t i = p * V;
    const int64_t r = kFlat ? 0 : i / D, c = kFlat ? i : i - r * D;
    float in[Op::kIn][V], out[Op::kOut][V];
#pragma unroll
    for (int k = 0; k < Op::kIn; ++k) {
      Pack<T, V> pk = *reinterpret_cast<const Pack<T, V>*>(o.in[k] + r * o.in_ld[k] + c);
#pragma unroll
      for (int j = 0; j < V; ++j) in[k][j] = to_f(pk.v[j]);
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float a[Op::kIn], b[Op::kOut];
#pragma unroll
      for (int k = 0; k < Op::kIn; ++k) a[k] = in[k][j];
      op(a, b);
#pragma unroll
      for (int k = 0; k < Op::kOut; ++k) out[k][j] = b[k];
    }
#pragma unroll
    for (int k = 0; k < Op::kOut; ++k) {
      Pack<T, V> pk;
#pragma unroll
      for (int j = 0; j < V; ++j) pk.v[j] = from_f<T>(out[k][j]);
      *reinterpret_cast<Pack<T, V>*>(o.out[k] + r * o.out_ld[k] + c) = pk;
    }
  }
  if constexpr (kFlat && V > 1) {
    const int64_t i = npack * V + tid;
    if (i < n) {
      float a[Op::kIn], b[Op::kOut];
#pragma unroll
      for (int k = 0; k < Op::kIn; ++k) a[k] = to_f(o.in[k][i]);
      op(a, b);
#pragma unroll
      for (int k = 0; k < Op::kOut; ++k) o.out[k][i] = from_f<T>(b[k]);
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <class T, class Op>
void launch_map(StreamHandle s, Op op, const Operands<T>& o, int64_t n, int64_t D) {
  if (n == 0) return;
  constexpr int V = 16 / sizeof(T);
  // Contiguous operands only need aligned base pointers (the tail is done element by element);
  // strided ones also need every row start aligned and no pack straddling two rows.
  bool flat = true, vec = true, rows_aligned = D % V == 0;
  for (int k = 0; k < Op::kIn; ++k) {
    flat = flat && o.in_ld[k] == D;
    vec = vec && aligned16(o.in[k]);
    rows_aligned = rows_aligned && o.in_ld[k] % V == 0;
  }
  for (int k = 0; k < Op::kOut; ++k) {
    flat = flat && o.out_ld[k] == D;
    vec = vec && aligned16(o.out[k]);
    rows_aligned = rows_aligned && o.out_ld[k] % V == 0;
  }
  if (!flat) vec = vec && rows_aligned;
  const int threads = 256;
  auto grid = [&](int64_t work) {
    int64_t blocks = (work + threads - 1) / threads;
    return unsigned(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
  };
  if (flat && vec) launch_dependent(map_kernel<V, true, T, Op>, dim3(grid(n / V > 0 ? n / V : n)), dim3(threads), 0, s, op, o, n, D);
  else if (flat) launch_dependent(map_kernel<1, true, T, Op>, dim3(grid(n)), dim3(threads), 0, s, op, o, n, D);
  else if (vec) launch_dependent(map_kernel<V, false, T, Op>, dim3(grid(n / V)), dim3(threads), 0, s, op, o, n, D);
  else launch_dependent(map_kernel<1, false, T, Op>, dim3(grid(n)), dim3(threads), 0, s, op, o, n, D);
  ZP_CUDA_LAUNCH_CHECK();
}

// Builders for the three operand shapes.
template <class T>
Operands<T> flat_ops(std::initializer_list<const void*> in, std::initializer_list<void*> out, int64_t n) {
  Operands<T> o;
  int k = 0;
  for (const void* p : in) { o.in[k] = static_cast<const T*>(p); o.in_ld[k++] = n; }
  k = 0;
  for (void* p : out) { o.out[k] = static_cast<T*>(p); o.out_ld[k++] = n; }
  return o;
}

}  // namespace

void gelu_forward(StreamHandle s, DType dt, void* y, const void* x, int64_t n, GeluKind kind) {
  ZP_CHECK(n >= 0, "n=", n);
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    auto o = flat_ops<T>({x}, {y}, n);
    if (kind == GeluKind::Erf) launch_map(s, GeluErfFwd{}, o, n, n);
    else launch_map(s, GeluTanhFwd{}, o, n, n);
  });
}

void gelu_backward(StreamHandle s, DType dt, void* dx, const void* dy, const void* x, int64_t n, GeluKind kind) {
  ZP_CHECK(n >= 0, "n=", n);
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    auto o = flat_ops<T>({dy, x}, {dx}, n);
    if (kind == GeluKind::Erf) launch_map(s, GeluErfBwd{}, o, n, n);
    else launch_map(s, GeluTanhBwd{}, o, n, n);
  });
}

void silu_forward(StreamHandle s, DType dt, void* y, const void* x, int64_t n) {
  ZP_CHECK(n >= 0, "n=", n);
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] { launch_map(s, SiluFwd{}, flat_ops<T>({x}, {y}, n), n, n); });
}

void silu_backward(StreamHandle s, DType dt, void* dx, const void* dy, const void* x, int64_t n) {
  ZP_CHECK(n >= 0, "n=", n);
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] { launch_map(s, SiluBwd{}, flat_ops<T>({dy, x}, {dx}, n), n, n); });
}

void swiglu_forward(StreamHandle s, DType dt, void* y, const void* gate, const void* up, int64_t n) {
  ZP_CHECK(n >= 0, "n=", n);
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] { launch_map(s, SwigluFwd{}, flat_ops<T>({gate, up}, {y}, n), n, n); });
}

void swiglu_backward(StreamHandle s, DType dt, void* dgate, void* dup, const void* dy, const void* gate,
                     const void* up, int64_t n) {
  ZP_CHECK(n >= 0, "n=", n);
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    launch_map(s, SwigluBwd{}, flat_ops<T>({dy, gate, up}, {dgate, dup}, n), n, n);
  });
}

namespace {
// y[rows, D] = op(x[:, :D], x[:, D:])
template <class Op>
void packed_forward(StreamHandle s, DType dt, Op op, void* y, const void* x, int64_t rows, int64_t D) {
  ZP_CHECK(rows >= 0 && D >= 0, "rows=", rows, " D=", D);
  if (D == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    Operands<T> o;
    o.in[0] = static_cast<const T*>(x);
    o.in[1] = static_cast<const T*>(x) + D;
    o.in_ld[0] = o.in_ld[1] = 2 * D;
    o.out[0] = static_cast<T*>(y);
    o.out_ld[0] = D;
    launch_map(s, op, o, rows * D, D);
  });
}
// [dx[:, :D] | dx[:, D:]] = op(dy, x[:, :D], x[:, D:])
template <class Op>
void packed_backward(StreamHandle s, DType dt, Op op, void* dx, const void* dy, const void* x, int64_t rows,
                     int64_t D) {
  ZP_CHECK(rows >= 0 && D >= 0, "rows=", rows, " D=", D);
  if (D == 0) return;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    Operands<T> o;
    o.in[0] = static_cast<const T*>(dy);
    o.in_ld[0] = D;
    o.in[1] = static_cast<const T*>(x);
    o.in[2] = static_cast<const T*>(x) + D;
    o.in_ld[1] = o.in_ld[2] = 2 * D;
    o.out[0] = static_cast<T*>(dx);
    o.out[1] = static_cast<T*>(dx) + D;
    o.out_ld[0] = o.out_ld[1] = 2 * D;
    launch_map(s, op, o, rows * D, D);
  });
}
}  // namespace

void swiglu_forward_packed(StreamHandle s, DType dt, void* y, const void* x, int64_t rows, int64_t D) {
  packed_forward(s, dt, SwigluFwd{}, y, x, rows, D);
}
void swiglu_backward_packed(StreamHandle s, DType dt, void* dx, const void* dy, const void* x, int64_t rows,
                            int64_t D) {
  packed_backward(s, dt, SwigluBwd{}, dx, dy, x, rows, D);
}
void geglu_forward_packed(StreamHandle s, DType dt, void* y, const void* x, int64_t rows, int64_t D) {
  packed_forward(s, dt, GegluFwd{}, y, x, rows, D);
}
void geglu_backward_packed(StreamHandle s, DType dt, void* dx, const void* dy, const void* x, int64_t rows,
                           int64_t D) {
  packed_backward(s, dt, GegluBwd{}, dx, dy, x, rows, D);
}

}  // namespace zp::kernels::cuda
