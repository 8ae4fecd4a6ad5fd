// Convolutions through cuDNN's legacy API (cudnnConvolutionForward / BackwardData / BackwardFilter)
// on channels-last images. cuDNN's NHWC tensor-core kernels want the filter channels-last too (KRSC;
// backward data and filter refuse NHWC images with a KCRS filter), while our weights keep the hub
// layout KCRS: a call with a kernel larger than 1x1 transposes the weight into scratch first (a
// weight's size, against the images' many times more), and the filter gradient comes back KRSC.
// The filter gradient: cuDNN writes it in the filter's dtype and layout, but ours is an fp32 KCRS
// accumulator, so cuDNN writes a temporary (beta = 0) that we add into dw, transposing it back.
// Per (device, dtype, shape) we cache descriptors and the algorithms the v7 heuristics rank first,
// preferring deterministic ones and, for f32, plain FMA math (never TF32) so that f32 matches the CPU
// reference at 1e-5.
// The bias: in 16-bit dtypes conv + bias must be rounded once, as the CPU reference does. Measured on
// an H200 (cuDNN 9.14), IMPLICIT_PRECOMP_GEMM, the algorithm the heuristics rank first for nearly every
// UNet shape, does not blend a prior y in fp32: with y preset to the bias and beta = 1, 26-30% of
// outputs missed the exact sum's nearest bf16 (tests/test_conv2d.cpp), enough to fail the bf16 UNet
// parity dumps. Its fused epilogue does add in fp32, so where that algorithm is chosen a forward with a
// bias goes through cudnnConvolutionBiasActivationForward with an identity activation (which cuDNN
// allows with that algorithm only). Other algorithms (IMPLICIT_GEMM, GEMM: measured) blend right, so
// they keep the preset bias and beta = 1; so does f32.
#include <cudnn.h>

#include <array>
#include <climits>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/log.h"
#include "kernels/conv2d.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/scratch.cuh"
#include "kernels/gemm.h"

namespace zp::kernels::cuda {
namespace {

// Algorithms needing more scratch than this are taken only when nothing else works.
constexpr size_t kPreferredWorkspaceBytes = size_t(512) << 20;

cudnnDataType_t cudnn_dtype(DType dt) {
  switch (dt) {
    case DType::F32: return CUDNN_DATA_FLOAT;
    case DType::BF16: return CUDNN_DATA_BFLOAT16;
    case DType::F16: return CUDNN_DATA_HALF;
    default: ZP_FATAL("conv2d: unsupported dtype ", dtype_name(dt), " on CUDA");
  }
}

struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  // One convolution descriptor per direction: each carries the math type of its chosen algorithm.
  cudnnConvolutionDescriptor_t fwd = nullptr, bwd_data = nullptr, bwd_filter = nullptr;
  cudnnConvolutionFwdAlgo_t fwd_algo{};
  cudnnConvolutionBwdDataAlgo_t bwd_data_algo{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter_algo{};
  size_t fwd_ws = 0, bwd_data_ws = 0, bwd_filter_ws = 0;
  // 16-bit forwards with a bias where fwd_algo is IMPLICIT_PRECOMP_GEMM: bias [1, Cout, 1, 1] and the
  // identity activation of cudnnConvolutionBiasActivationForward (null otherwise).
  cudnnTensorDescriptor_t bias = nullptr;
  cudnnActivationDescriptor_t identity = nullptr;
};

// Everything cuDNN needs on one device. cuDNN handles are not safe to share between host threads, so
// a call holds `mu` while it sets the stream and enqueues (enqueueing is quick; nothing waits on the GPU).
struct DeviceContext {
  std::mutex mu;
  cudnnHandle_t handle = nullptr;
  std::map<std::array<int64_t, 12>, std::unique_ptr<ConvPlan>> plans;  // plans live as long as the process
};

DeviceContext& context_for(int dev) {
  static std::mutex mu;
  static std::vector<std::unique_ptr<DeviceContext>> contexts;
  std::lock_guard<std::mutex> lock(mu);
  if (size_t(dev) >= contexts.size()) contexts.resize(size_t(dev) + 1);
  if (!contexts[size_t(dev)]) {
    auto c = std::make_unique<DeviceContext>();
    ZP_CUDNN_CHECK(cudnnCreate(&c->handle));
    contexts[size_t(dev)] = std::move(c);
  }
  return *contexts[size_t(dev)];
}

// f32 asks for FMA math (DEFAULT would allow TF32 tensor cores on Ampere and later, missing the f32
// tolerance) and the heuristics then rank FMA algorithms only; we insist on it, as PyTorch does.
// 16-bit asks for tensor-op math; algorithms without tensor-core kernels come back as DEFAULT math.
bool math_allowed(cudnnMathType_t m, DType dt) { return dt != DType::F32 || m == CUDNN_FMA_MATH; }

// Index of the best heuristic result: deterministic and within the preferred workspace if possible.
template <class Perf> int pick_algo(const Perf* perf, int count, DType dt, const char* what) {
  auto usable = [&](const Perf& p) { return p.status == CUDNN_STATUS_SUCCESS && math_allowed(p.mathType, dt); };
  for (int pass = 0; pass < 3; ++pass)
    for (int i = 0; i < count; ++i) {
      const Perf& p = perf[i];
      if (!usable(p)) continue;
      if (pass == 0 && (p.determinism != CUDNN_DETERMINISTIC || p.memory > kPreferredWorkspaceBytes)) continue;
      if (pass == 1 && p.memory > kPreferredWorkspaceBytes) continue;
      return i;
    }
  ZP_FATAL("conv2d: cuDNN offers no usable ", what, " algorithm for dtype ", dtype_name(dt),
           dt == DType::F32 ? " (f32 requires FMA math, no TF32)" : "");
}

cudnnConvolutionDescriptor_t make_conv_desc(const Conv2dShape& c, DType dt) {
  cudnnConvolutionDescriptor_t d;
  ZP_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d));
  ZP_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(d, int(c.pad_h), int(c.pad_w), int(c.stride_h), int(c.stride_w),
                                                 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  ZP_CUDNN_CHECK(cudnnSetConvolutionMathType(d, dt == DType::F32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
  return d;
}

std::unique_ptr<ConvPlan> make_plan(cudnnHandle_t h, const Conv2dShape& c, DType dt) {
  for (int64_t v : {c.N, c.Cin, c.H, c.W, c.Cout, c.KH, c.KW, c.oh(), c.ow()})
    ZP_CHECK(v > 0 && v < INT_MAX, "conv2d: dimension out of range for cuDNN");
  ZP_CHECK(c.stride_h > 0 && c.stride_w > 0 && c.pad_h >= 0 && c.pad_w >= 0);
  ZP_CHECK(c.y_numel() < INT_MAX && c.x_numel() < INT_MAX, "conv2d: tensor too large for 4-d cuDNN descriptors");
  const cudnnDataType_t t = cudnn_dtype(dt);
  auto p = std::make_unique<ConvPlan>();
  ZP_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->x));
  ZP_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NHWC, t, int(c.N), int(c.Cin), int(c.H), int(c.W)));
  ZP_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->y));
  ZP_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NHWC, t, int(c.N), int(c.Cout), int(c.oh()), int(c.ow())));
  ZP_CUDNN_CHECK(cudnnCreateFilterDescriptor(&p->w));
  ZP_CUDNN_CHECK(cudnnSetFilter4dDescriptor(p->w, t, CUDNN_TENSOR_NHWC, int(c.Cout), int(c.Cin), int(c.KH), int(c.KW)));
  p->fwd = make_conv_desc(c, dt);
  p->bwd_data = make_conv_desc(c, dt);
  p->bwd_filter = make_conv_desc(c, dt);

  int n = 0;
  {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    ZP_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, p->x, p->w, p->fwd, p->y,
                                                          CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf));
    const auto& best = perf[pick_algo(perf, n, dt, "forward")];
    p->fwd_algo = best.algo;
    ZP_CUDNN_CHECK(cudnnSetConvolutionMathType(p->fwd, best.mathType));
    ZP_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, p->x, p->w, p->fwd, p->y, p->fwd_algo, &p->fwd_ws));
    if (dt != DType::F32 && p->fwd_algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM) {
      ZP_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->bias));
      ZP_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->bias, CUDNN_TENSOR_NHWC, t, 1, int(c.Cout), 1, 1));
      ZP_CUDNN_CHECK(cudnnCreateActivationDescriptor(&p->identity));
      ZP_CUDNN_CHECK(
          cudnnSetActivationDescriptor(p->identity, CUDNN_ACTIVATION_IDENTITY, CUDNN_NOT_PROPAGATE_NAN, 0.0));
    }
  }
  {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    ZP_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p->w, p->y, p->bwd_data, p->x,
                                                               CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf));
    const auto& best = perf[pick_algo(perf, n, dt, "backward-data")];
    p->bwd_data_algo = best.algo;
    ZP_CUDNN_CHECK(cudnnSetConvolutionMathType(p->bwd_data, best.mathType));
    ZP_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, p->w, p->y, p->bwd_data, p->x, p->bwd_data_algo,
                                                                &p->bwd_data_ws));
  }
  {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    ZP_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p->x, p->y, p->bwd_filter, p->w,
                                                                 CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf));
    const auto& best = perf[pick_algo(perf, n, dt, "backward-filter")];
    p->bwd_filter_algo = best.algo;
    ZP_CUDNN_CHECK(cudnnSetConvolutionMathType(p->bwd_filter, best.mathType));
    ZP_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p->x, p->y, p->bwd_filter, p->w,
                                                                  p->bwd_filter_algo, &p->bwd_filter_ws));
  }
  // cuDNN's enum values: which algorithm (and so which rounding) each direction took.
  ZP_LOG_DEBUG("conv2d ", dtype_name(dt), " N", c.N, " C", c.Cin, "->", c.Cout, " ", c.H, "x", c.W, " k", c.KH, "x",
               c.KW, " s", c.stride_h, ": algorithms forward ", int(p->fwd_algo), ", backward-data ",
               int(p->bwd_data_algo), ", backward-filter ", int(p->bwd_filter_algo));
  return p;
}

// The device's context, locked, with the plan for (dt, shape) and the handle bound to stream s.
struct Bound {
  DeviceContext& ctx;
  std::unique_lock<std::mutex> lock;
  ConvPlan& plan;
  int device;
};
Bound bind(StreamHandle s, DType dt, const Conv2dShape& c) {
  int dev = 0;
  ZP_CUDA_CHECK(cudaGetDevice(&dev));
  DeviceContext& ctx = context_for(dev);
  std::unique_lock<std::mutex> lock(ctx.mu);
  std::array<int64_t, 12> key = {int64_t(dt), c.N, c.Cin, c.H, c.W, c.Cout, c.KH, c.KW,
                                 c.stride_h, c.stride_w, c.pad_h, c.pad_w};
  auto& slot = ctx.plans[key];
  if (!slot) slot = make_plan(ctx.handle, c, dt);
  ZP_CUDNN_CHECK(cudnnSetStream(ctx.handle, s));
  return {ctx, std::move(lock), *slot, dev};
}

// y[p, c] = bias[c] for every output pixel p.
template <class T>
__global__ void fill_bias_kernel(T* y, const T* bias, int64_t C, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = bias[i % C];
}

// dst[i] += src[i], VEC elements a thread when n and both pointers allow 16-byte packs of src.
template <class T, int VEC>
__global__ void accumulate_kernel(float* dst, const T* src, int64_t n) {
  const int64_t packs = n / VEC;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < packs; i += int64_t(gridDim.x) * blockDim.x) {
    const Pack<T, VEC> v = reinterpret_cast<const Pack<T, VEC>*>(src)[i];
    Pack<float, VEC> d = reinterpret_cast<Pack<float, VEC>*>(dst)[i];
#pragma unroll
    for (int j = 0; j < VEC; ++j) d.v[j] += to_f(v.v[j]);
    reinterpret_cast<Pack<float, VEC>*>(dst)[i] = d;
  }
}

// The filter's two layouts, moved a (filter k, 512 input channels) tile per block through shared
// memory so that both sides are contiguous runs: in KCRS the tile is 512 * RS consecutive elements, in
// KRSC it is RS runs of 512. Global memory moves in packs of VEC elements (16 bytes where Cin allows),
// a KRSC pack being VEC consecutive channels of one tap. (A plain transpose of [Cin, RS] per filter
// wastes most of its 32x32 tiles on RS = 9; 2-byte accesses moved SD 1.5's 1.1 GB of filters at
// 1.2 TB/s, H200.)
constexpr int kFilterTile = 512;

// y[k, rs, c] = w[k, c, rs]
template <class T, int VEC>
__global__ void filter_to_krsc_kernel(T* __restrict__ y, const T* __restrict__ w, int64_t Cin, int RS) {
  using P = Pack<T, VEC>;
  extern __shared__ __align__(16) unsigned char raw[];
  T* tile = reinterpret_cast<T*>(raw);  // [c][rs]
  const int64_t k = blockIdx.y, c0 = int64_t(blockIdx.x) * kFilterTile;
  const int nc = int(min(int64_t(kFilterTile), Cin - c0)), packs = nc * RS / VEC, row_packs = nc / VEC;
  const P* src = reinterpret_cast<const P*>(w + (k * Cin + c0) * RS);
  for (int i = threadIdx.x; i < packs; i += blockDim.x) reinterpret_cast<P*>(tile)[i] = src[i];
  __syncthreads();
  for (int i = threadIdx.x; i < packs; i += blockDim.x) {
    const int rs = i / row_packs, c = (i % row_packs) * VEC;
    P out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) out.v[j] = tile[(c + j) * RS + rs];
    *reinterpret_cast<P*>(y + (k * RS + rs) * Cin + c0 + c) = out;
  }
}

// dw[k, c, rs] += g[k, rs, c]: the KRSC gradient cuDNN wrote, added into the KCRS accumulator.
template <class T, int VEC>
__global__ void accumulate_from_krsc_kernel(float* __restrict__ dw, const T* __restrict__ g, int64_t Cin, int RS) {
  using P = Pack<T, VEC>;
  using F = Pack<float, VEC>;
  extern __shared__ __align__(16) unsigned char raw[];
  T* tile = reinterpret_cast<T*>(raw);  // [c][rs]
  const int64_t k = blockIdx.y, c0 = int64_t(blockIdx.x) * kFilterTile;
  const int nc = int(min(int64_t(kFilterTile), Cin - c0)), packs = nc * RS / VEC, row_packs = nc / VEC;
  for (int i = threadIdx.x; i < packs; i += blockDim.x) {
    const int rs = i / row_packs, c = (i % row_packs) * VEC;
    const P v = *reinterpret_cast<const P*>(g + (k * RS + rs) * Cin + c0 + c);
#pragma unroll
    for (int j = 0; j < VEC; ++j) tile[(c + j) * RS + rs] = v.v[j];
  }
  __syncthreads();
  F* dst = reinterpret_cast<F*>(dw + (k * Cin + c0) * RS);
  const P* t = reinterpret_cast<const P*>(tile);
  for (int i = threadIdx.x; i < packs; i += blockDim.x) {
    F d = dst[i];
    const P v = t[i];
#pragma unroll
    for (int j = 0; j < VEC; ++j) d.v[j] += to_f(v.v[j]);
    dst[i] = d;
  }
}

// The grid and shared memory of the two kernels above.
struct FilterTiles {
  dim3 grid;
  size_t smem;
  FilterTiles(const Conv2dShape& c, size_t elem)
      : grid(ceil_div(c.Cin, kFilterTile), unsigned(c.Cout)), smem(size_t(kFilterTile) * c.KH * c.KW * elem) {
    ZP_CHECK(c.Cout <= 65535 && smem <= 48 * 1024, "conv2d: filter ", c.Cout, "x", c.Cin, "x", c.KH, "x", c.KW,
             " too large for the layout kernels");
  }
};

unsigned grid_for(int64_t n, int64_t cap = 65535 * 8) {
  int64_t blocks = (n + 255) / 256;
  return unsigned(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}

// The weight as cuDNN's NHWC descriptors read it: KRSC, in scratch, or w itself for a 1x1 kernel.
struct KrscFilter {
  KernelScratch copy;
  const void* data;
  KrscFilter(StreamHandle s, DType dt, const void* w, const Conv2dShape& c)
      : copy(s, c.KH * c.KW == 1 ? 0 : size_t(c.w_numel()) * dtype_size(dt), "cudnn_scratch"), data(w) {
    if (c.KH * c.KW == 1) return;
    ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
      const FilterTiles t(c, sizeof(T));
      T* y = static_cast<T*>(copy.get());
      const T* x = static_cast<const T*>(w);
      with_pack_width<T>(c.Cin, {y, x}, [&](auto vec) {
        filter_to_krsc_kernel<T, decltype(vec)::value><<<t.grid, 256, t.smem, s>>>(y, x, c.Cin, int(c.KH * c.KW));
      });
    });
    ZP_CUDA_LAUNCH_CHECK();
    data = copy.get();
  }
};

}  // namespace

void conv2d_forward(StreamHandle s, DType dt, void* y, const void* x, const void* w, const void* bias,
                    const Conv2dShape& c) {
  KrscFilter filter(s, dt, w, c);
  w = filter.data;
  Bound b = bind(s, dt, c);
  KernelScratch ws(s, b.plan.fwd_ws, "cudnn_scratch");
  const float one = 1.f, zero = 0.f;
  if (bias && b.plan.identity) {
    // y = identity(conv + 0 * z + bias), z aliasing y: with alpha2 = 0 the epilogue does not read z
    // (Conv2dGpu.Bf16BiasIsAddedBeforeTheOneRounding starts y as NaN).
    ZP_CUDNN_CHECK(cudnnConvolutionBiasActivationForward(
        b.ctx.handle, &one, b.plan.x, x, b.plan.w, w, b.plan.fwd, b.plan.fwd_algo, ws.get(), ws.bytes(), &zero,
        b.plan.y, y, b.plan.bias, bias, b.plan.identity, b.plan.y, y));
    return;
  }
  // Otherwise y starts as the bias and cuDNN accumulates into it (beta = 1), blending in fp32.
  if (bias) {
    ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
      fill_bias_kernel<<<grid_for(c.y_numel()), 256, 0, s>>>(static_cast<T*>(y), static_cast<const T*>(bias), c.Cout,
                                                             c.y_numel());
    });
    ZP_CUDA_LAUNCH_CHECK();
  }
  ZP_CUDNN_CHECK(cudnnConvolutionForward(b.ctx.handle, &one, b.plan.x, x, b.plan.w, w, b.plan.fwd, b.plan.fwd_algo,
                                         ws.get(), ws.bytes(), bias ? &one : &zero, b.plan.y, y));
}

void conv2d_backward_data(StreamHandle s, DType dt, void* dx, const void* dy, const void* w, const Conv2dShape& c) {
  KrscFilter filter(s, dt, w, c);
  w = filter.data;
  Bound b = bind(s, dt, c);
  KernelScratch ws(s, b.plan.bwd_data_ws, "cudnn_scratch");
  const float one = 1.f, zero = 0.f;
  ZP_CUDNN_CHECK(cudnnConvolutionBackwardData(b.ctx.handle, &one, b.plan.w, w, b.plan.y, dy, b.plan.bwd_data,
                                              b.plan.bwd_data_algo, ws.get(), ws.bytes(), &zero, b.plan.x, dx));
}

void conv2d_backward_filter(StreamHandle s, DType dt, float* dw, float* dbias, const void* dy, const void* x,
                            const Conv2dShape& c) {
  {
    Bound b = bind(s, dt, c);
    KernelScratch ws(s, b.plan.bwd_filter_ws, "cudnn_scratch");
    const float one = 1.f, zero = 0.f;
    const int64_t n = c.w_numel(), RS = c.KH * c.KW;
    KernelScratch grad(s, size_t(n) * dtype_size(dt), "cudnn_scratch");
    ZP_CUDNN_CHECK(cudnnConvolutionBackwardFilter(b.ctx.handle, &one, b.plan.x, x, b.plan.y, dy, b.plan.bwd_filter,
                                                  b.plan.bwd_filter_algo, ws.get(), ws.bytes(), &zero, b.plan.w,
                                                  grad.get()));
    ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
      constexpr int V = 16 / sizeof(T);
      const T* g = static_cast<const T*>(grad.get());
      // dw takes packs of V floats: V * 4 bytes of alignment, more than can_vectorise asks.
      const bool dw_packs = reinterpret_cast<uintptr_t>(dw) % (V * sizeof(float)) == 0;
      if (RS > 1) {
        const FilterTiles t(c, sizeof(T));
        if (dw_packs && can_vectorise<T>(c.Cin, {g}))
          accumulate_from_krsc_kernel<T, V><<<t.grid, 256, t.smem, s>>>(dw, g, c.Cin, int(RS));
        else
          accumulate_from_krsc_kernel<T, 1><<<t.grid, 256, t.smem, s>>>(dw, g, c.Cin, int(RS));
      } else if (dw_packs && can_vectorise<T>(n, {g}))
        accumulate_kernel<T, V><<<grid_for(n / V), 256, 0, s>>>(dw, g, n);
      else
        accumulate_kernel<T, 1><<<grid_for(n), 256, 0, s>>>(dw, g, n);
    });
    ZP_CUDA_LAUNCH_CHECK();
  }
  if (dbias) bias_grad(s, dt, dbias, dy, c.N * c.oh() * c.ow(), c.Cout);
}

}  // namespace zp::kernels::cuda
