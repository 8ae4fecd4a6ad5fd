// GEMM on cuBLASLt. cuBLASLt is column-major; a row-major C[M,N] read column-major is C^T[N,M], and
// C^T = op(B)^T op(A)^T, so we hand cuBLASLt our B as its "A" and our A as its "B" and nothing moves.
// Building descriptors and asking the heuristic costs far more than a small matmul, so each distinct
// problem (dtypes, shape, leading dimensions, batch strides, epilogue, pointer alignments) gets one
// plan, built once and cached. Pointer alignment is part of the key because the heuristic picks
// kernels that assume it. Each device has one handle; each stream has its own workspace, since two
// streams running matmuls at once must not share one.
// Epilogues cuBLASLt cannot fuse here run as a small kernel after the product instead:
//  - a bias over 16-bit operands with an fp32 C (cuBLASLt wants the bias in C's type, ours is ab_dt),
//  - a GELU aux whose leading dimension N is not a multiple of 8 (cuBLASLt requires it),
//  - any combination for which the heuristic offers no fused algorithm, and K == 0.
// cuBLASLt's fused GELU uses an approximate tanh: about 1e-5 relative in fp32, far below bf16's step.
// A decode step's products (a few rows against a weight, 16-bit, no GELU) go to row_linear.cu.
#include <cublasLt.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/row_linear.cuh"
#include "kernels/cuda/scratch.cuh"
#include "kernels/gemm.h"

namespace zp::kernels::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

cudaDataType_t cuda_dtype(DType dt) {
  switch (dt) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: ZP_FATAL("gemm: unsupported CUDA dtype ", dtype_name(dt));
  }
}

// Largest power of two (at most 16) dividing every address the matrices of a batch start at.
uint32_t alignment(const void* p, int64_t batch, int64_t stride_elems, size_t elem_size) {
  uintptr_t bits = uintptr_t(p) | (batch > 1 ? uintptr_t(stride_elems) * elem_size : 0);
  for (uint32_t a = 16; a > 1; a /= 2)
    if (bits % a == 0) return a;
  return 1;
}

struct PlanKey {
  int device;
  DType ab_dt, c_dt;
  bool trans_a, trans_b;
  int64_t M, N, K, lda, ldb, ldc, batch, stride_a, stride_b, stride_c;
  GemmEpilogue ep;
  bool has_aux;
  uint32_t align_a, align_b, align_c, align_bias, align_aux;
  bool operator==(const PlanKey&) const = default;
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    size_t h = 0;
    auto mix = [&](uint64_t v) { h ^= std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    mix(uint64_t(k.device));
    mix(uint64_t(k.ab_dt) | uint64_t(k.c_dt) << 8 | uint64_t(k.trans_a) << 16 | uint64_t(k.trans_b) << 17 |
        uint64_t(k.ep) << 18 | uint64_t(k.has_aux) << 26);
    for (int64_t v : {k.M, k.N, k.K, k.lda, k.ldb, k.ldc, k.batch, k.stride_a, k.stride_b, k.stride_c}) mix(uint64_t(v));
    mix(uint64_t(k.align_a) | uint64_t(k.align_b) << 8 | uint64_t(k.align_c) << 16 | uint64_t(k.align_bias) << 24 |
        uint64_t(k.align_aux) << 32);
    return h;
  }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t lt_a = nullptr, lt_b = nullptr, lt_c = nullptr;  // cuBLASLt's A (our B), B (our A), C=D
  cublasLtMatmulAlgo_t algo{};
  bool fused_epilogue = false;  // false: our epilogue kernel runs after the matmul
};

struct DeviceState {
  cublasLtHandle_t handle = nullptr;
};

// Handles and plans live for the whole process: destroying them from static destructors
// would race the CUDA runtime's own teardown at exit.
std::mutex g_mu;
std::unordered_map<int, DeviceState>& devices() {
  static auto* m = new std::unordered_map<int, DeviceState>();
  return *m;
}
std::unordered_map<PlanKey, Plan, PlanKeyHash>& plans() {
  static auto* m = new std::unordered_map<PlanKey, Plan, PlanKeyHash>();
  return *m;
}

// Caller holds g_mu.
DeviceState& device_state(int dev) {
  DeviceState& d = devices()[dev];
  if (!d.handle) ZP_CUBLAS_CHECK(cublasLtCreate(&d.handle));
  return d;
}
void* workspace(StreamHandle s) { return stream_workspace(s, kWorkspaceBytes, "gemm_workspace"); }

cublasLtEpilogue_t lt_epilogue(GemmEpilogue ep, bool has_aux) {
  switch (ep) {
    case GemmEpilogue::None: return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::Gelu: return has_aux ? CUBLASLT_EPILOGUE_GELU_AUX : CUBLASLT_EPILOGUE_GELU;
    case GemmEpilogue::BiasGelu: return has_aux ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS;
    case GemmEpilogue::DGelu: return CUBLASLT_EPILOGUE_DGELU;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

cublasLtMatrixLayout_t make_layout(DType dt, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t l;
  ZP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, cuda_dtype(dt), uint64_t(rows), uint64_t(cols), ld));
  if (batch > 1) {
    int32_t count = int32_t(batch);
    ZP_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    ZP_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                     sizeof(stride)));
  }
  return l;
}

// Sets the pointers the epilogue reads or writes; they change from call to call.
void set_epilogue_pointers(cublasLtMatmulDesc_t desc, const void* bias, void* aux) {
  if (bias) ZP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  if (aux) ZP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
}

// Builds descriptors for `key` with cuBLASLt epilogue `epi` and asks for the best algorithm.
// Returns false (and frees everything) when the heuristic has none.
bool try_plan(cublasLtHandle_t handle, const PlanKey& k, cublasLtEpilogue_t epi, const void* bias, void* aux,
              Plan& plan) {
  Plan p;
  ZP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t op_a = k.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our B
  cublasOperation_t op_b = k.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  ZP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  ZP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  ZP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  if (epi == CUBLASLT_EPILOGUE_BIAS || epi == CUBLASLT_EPILOGUE_GELU_BIAS || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
    int32_t bias_type = cuda_dtype(k.ab_dt);
    ZP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                   sizeof(bias_type)));
    set_epilogue_pointers(p.desc, bias, nullptr);
  }
  if (epi == CUBLASLT_EPILOGUE_GELU_AUX || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epi == CUBLASLT_EPILOGUE_DGELU) {
    int64_t aux_ld = k.N, aux_stride = k.M * k.N;
    ZP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    if (k.batch > 1)
      ZP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE,
                                                     &aux_stride, sizeof(aux_stride)));
    set_epilogue_pointers(p.desc, nullptr, aux);
  }
  p.lt_a = k.trans_b ? make_layout(k.ab_dt, k.K, k.N, k.ldb, k.batch, k.stride_b)
                     : make_layout(k.ab_dt, k.N, k.K, k.ldb, k.batch, k.stride_b);
  p.lt_b = k.trans_a ? make_layout(k.ab_dt, k.M, k.K, k.lda, k.batch, k.stride_a)
                     : make_layout(k.ab_dt, k.K, k.M, k.lda, k.batch, k.stride_a);
  p.lt_c = make_layout(k.c_dt, k.N, k.M, k.ldc, k.batch, k.stride_c);

  cublasLtMatmulPreference_t pref;
  ZP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = kWorkspaceBytes;
  ZP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  ZP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &k.align_b,
                                                       sizeof(uint32_t)));
  ZP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &k.align_a,
                                                       sizeof(uint32_t)));
  ZP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &k.align_c,
                                                       sizeof(uint32_t)));
  ZP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &k.align_c,
                                                       sizeof(uint32_t)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.lt_a, p.lt_b, p.lt_c, p.lt_c, pref, 1,
                                                     &result, &found);
  ZP_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  if (st != CUBLAS_STATUS_NOT_SUPPORTED) ZP_CUBLAS_CHECK(st);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || found == 0) {
    ZP_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p.lt_a));
    ZP_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p.lt_b));
    ZP_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p.lt_c));
    ZP_CUBLAS_CHECK(cublasLtMatmulDescDestroy(p.desc));
    return false;
  }
  p.algo = result.algo;
  p.fused_epilogue = epi != CUBLASLT_EPILOGUE_DEFAULT;
  plan = p;
  return true;
}

// Caller holds g_mu.
Plan& get_plan(cublasLtHandle_t handle, const PlanKey& k, const void* bias, void* aux) {
  auto it = plans().find(k);
  if (it != plans().end()) return it->second;
  Plan p;
  const bool has_bias = k.ep == GemmEpilogue::Bias || k.ep == GemmEpilogue::BiasGelu;
  bool can_fuse = k.ep != GemmEpilogue::None;
  if (has_bias && k.c_dt != k.ab_dt) can_fuse = false;  // cuBLASLt's bias is in C's type here
  if (k.has_aux && k.N % 8 != 0) can_fuse = false;       // cuBLASLt: aux ld must be a multiple of 8
  bool ok = can_fuse && try_plan(handle, k, lt_epilogue(k.ep, k.has_aux), bias, aux, p);
  if (!ok && !try_plan(handle, k, CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, p))
    ZP_FATAL("gemm: cuBLASLt has no algorithm for ", dtype_name(k.ab_dt), "->", dtype_name(k.c_dt),
             " M=", k.M, " N=", k.N, " K=", k.K, " lda=", k.lda, " ldb=", k.ldb, " ldc=", k.ldc,
             " trans_a=", k.trans_a, " trans_b=", k.trans_b, " batch=", k.batch, " alignments A/B/C=",
             k.align_a, "/", k.align_b, "/", k.align_c);
  return plans().emplace(k, p).first->second;
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
__device__ __forceinline__ float gelu_tanh(float x) {
  return 0.5f * x * (1.f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float gelu_tanh_grad(float x) {
  const float t = tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x));
  return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * kSqrt2OverPi * (1.f + 3.f * 0.044715f * x * x);
}

enum class Act : uint8_t { None, Gelu, DGelu };

// pre = c_scale * C + bias; then Gelu: aux = pre (when given), C = gelu(pre); DGelu: C = pre *
// gelu'(aux); None: aux = pre (when given), C = pre. c_scale is 1 after a matmul that already
// applied alpha and beta, or beta when K == 0 (no matmul ran); c_scale == 0 never reads C.
template <class TC, class TB>
__global__ void epilogue_kernel(TC* C, int64_t ldc, int64_t stride_c, float c_scale, const TB* bias, TC* aux,
                                Act act, int64_t M, int64_t N, int64_t batch) {
  const int64_t total = batch * M * N;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total; idx += int64_t(gridDim.x) * blockDim.x) {
    int64_t j = idx % N, row = idx / N, i = row % M, b = row / M;
    TC* c = C + b * stride_c + i * ldc + j;
    float pre = c_scale != 0.f ? c_scale * to_f(*c) : 0.f;
    if (bias) pre += to_f(bias[j]);
    if (act == Act::DGelu) {
      *c = from_f<TC>(pre * gelu_tanh_grad(to_f(aux[idx])));
      continue;
    }
    if (aux) aux[idx] = from_f<TC>(pre);
    *c = from_f<TC>(act == Act::Gelu ? gelu_tanh(pre) : pre);
  }
}

template <class T>
void launch_epilogue(StreamHandle s, DType c_dt, void* C, int64_t ldc, int64_t stride_c, float c_scale,
                     const void* bias, void* aux, Act act, int64_t M, int64_t N, int64_t batch) {
  int64_t total = batch * M * N;
  unsigned grid = unsigned(std::min<int64_t>((total + 255) / 256, 65535 * 8));
  if (c_dt == DType::F32)
    epilogue_kernel<float, T><<<grid, 256, 0, s>>>(static_cast<float*>(C), ldc, stride_c, c_scale,
                                                   static_cast<const T*>(bias), static_cast<float*>(aux), act, M, N, batch);
  else
    epilogue_kernel<T, T><<<grid, 256, 0, s>>>(static_cast<T*>(C), ldc, stride_c, c_scale, static_cast<const T*>(bias),
                                               static_cast<T*>(aux), act, M, N, batch);
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace

void gemm(StreamHandle s, DType ab_dt, DType c_dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
          float alpha, const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc,
          GemmEpilogue ep, const void* bias, void* aux, int64_t batch, int64_t stride_a, int64_t stride_b,
          int64_t stride_c, const void* c_in) {
  ZP_CHECK(M >= 0 && N >= 0 && K >= 0 && batch >= 0, "M=", M, " N=", N, " K=", K, " batch=", batch);
  ZP_CHECK(lda >= std::max<int64_t>(1, trans_a ? M : K), "lda=", lda);
  ZP_CHECK(ldb >= std::max<int64_t>(1, trans_b ? K : N), "ldb=", ldb);
  ZP_CHECK(ldc >= std::max<int64_t>(1, N), "ldc=", ldc);
  ZP_CHECK(ab_dt == DType::F32 || ab_dt == DType::BF16 || ab_dt == DType::F16, "gemm: operands ",
           dtype_name(ab_dt), " unsupported on CUDA");
  ZP_CHECK(c_dt == ab_dt || c_dt == DType::F32, "C must be ", dtype_name(ab_dt), " or f32, got ", dtype_name(c_dt));
  ZP_CHECK(batch <= INT32_MAX, "batch=", batch);
  const bool has_bias = ep == GemmEpilogue::Bias || ep == GemmEpilogue::BiasGelu;
  const bool has_gelu = ep == GemmEpilogue::Gelu || ep == GemmEpilogue::BiasGelu;
  const Act act = ep == GemmEpilogue::DGelu ? Act::DGelu : has_gelu ? Act::Gelu : Act::None;
  ZP_CHECK(!has_bias || bias != nullptr, "bias epilogue without a bias");
  ZP_CHECK(aux == nullptr || has_gelu || act == Act::DGelu, "aux is only written by the GELU epilogues or read by DGelu");
  ZP_CHECK(act != Act::DGelu || (aux != nullptr && beta == 0.f), "the DGelu epilogue reads aux and takes beta = 0");
  if (M == 0 || N == 0 || batch == 0) return;
  ZP_CHECK(c_in == nullptr || K > 0, "gemm: a separate C input needs K > 0");

  if (K == 0) {  // cuBLASLt rejects K == 0; the product is zero, so only beta * C and the epilogue remain
    ZP_CUDA_DISPATCH_FLOAT(ab_dt, T, [&] {
      launch_epilogue<T>(s, c_dt, C, ldc, stride_c, beta, has_bias ? bias : nullptr, aux, act, M, N, batch);
    });
    return;
  }

  if (!trans_a && trans_b && batch == 1 && c_dt == ab_dt && alpha == 1.f && aux == nullptr &&
      (ep == GemmEpilogue::None || ep == GemmEpilogue::Bias) &&
      decode_gemv(s, ab_dt, M, N, K, A, lda, B, ldb, beta, C, ldc, has_bias ? bias : nullptr, c_in))
    return;

  int dev;
  ZP_CUDA_CHECK(cudaGetDevice(&dev));
  const size_t ab_size = dtype_size(ab_dt), c_size = dtype_size(c_dt);
  PlanKey key{dev, ab_dt, c_dt, trans_a, trans_b, M, N, K, lda, ldb, ldc, batch,
              batch > 1 ? stride_a : 0, batch > 1 ? stride_b : 0, batch > 1 ? stride_c : 0, ep, aux != nullptr,
              alignment(A, batch, stride_a, ab_size), alignment(B, batch, stride_b, ab_size),
              std::min(alignment(C, batch, stride_c, c_size), c_in ? alignment(c_in, batch, stride_c, c_size) : 16u),
              has_bias ? alignment(bias, 1, 0, ab_size) : 0,
              aux ? alignment(aux, batch, M * N, c_size) : 0};

  std::lock_guard<std::mutex> lock(g_mu);
  DeviceState& d = device_state(dev);
  void* ws = workspace(s);
  Plan& plan = get_plan(d.handle, key, has_bias ? bias : nullptr, aux);
  if (plan.fused_epilogue) set_epilogue_pointers(plan.desc, has_bias ? bias : nullptr, aux);
  ZP_CUBLAS_CHECK(cublasLtMatmul(d.handle, plan.desc, &alpha, B, plan.lt_a, A, plan.lt_b, &beta, c_in ? c_in : C,
                                 plan.lt_c, C, plan.lt_c, &plan.algo, ws, kWorkspaceBytes, s));
  if (!plan.fused_epilogue && ep != GemmEpilogue::None) {
    // Bit-for-bit this rounds pre to c_dt before the GELU, which the fused path does not: within
    // c_dt's precision either way.
    ZP_CUDA_DISPATCH_FLOAT(ab_dt, T, [&] {
      launch_epilogue<T>(s, c_dt, C, ldc, stride_c, 1.f, has_bias ? bias : nullptr, aux, act, M, N, batch);
    });
  }
}

void bias_grad(StreamHandle s, DType dt, float* dbias, const void* dy, int64_t M, int64_t N) {
  ZP_CHECK(M >= 0 && N >= 0, "M=", M, " N=", N);
  if (M == 0 || N == 0) return;
  float* partial = static_cast<float*>(workspace(s));  // scratch, ordered on s like the matmuls using it
  // Split rows within the workspace; with more than one split a second pass adds the partial sums.
  int64_t splits = 1;
  ZP_CUDA_DISPATCH_FLOAT(dt, T, [&] {
    with_pack_width<T>(N, {dy}, [&](auto vec) {
      constexpr int VEC = decltype(vec)::value;
      const int64_t col_blocks = ceil_div(N, int64_t(kColumnSumCols) * VEC);
      const ColumnSumSplits sp(M, col_blocks, int64_t(kWorkspaceBytes / sizeof(float)) / N);
      splits = sp.splits;
      column_sums_kernel<T, VEC><<<dim3(unsigned(col_blocks), unsigned(splits)), dim3(kColumnSumCols, kColumnSumRows),
                                   0, s>>>(dbias, partial, static_cast<const T*>(dy), M, N, sp.rows_per_split);
    });
  });
  ZP_CUDA_LAUNCH_CHECK();
  if (splits == 1) return;
  with_pack_width<float>(N, {partial}, [&](auto vec) {
    constexpr int VEC = decltype(vec)::value;
    column_sums_kernel<float, VEC><<<ceil_div(N, int64_t(kColumnSumCols) * VEC), dim3(kColumnSumCols, kColumnSumRows),
                                     0, s>>>(dbias, nullptr, partial, splits, N, splits);
  });
  ZP_CUDA_LAUNCH_CHECK();
}

}  // namespace zp::kernels::cuda
