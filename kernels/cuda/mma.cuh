// Warp-level tensor-core building blocks for sm_80 and later, shared by the flash attention kernels
// and the paged decode attention: cp.async into shared memory, ldmatrix, mma.sync m16n8k16 with fp32
// accumulators, and the accumulator-to-operand repacking. On older architectures the bodies compile
// to nothing (the launchers never take these paths there).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace zp::kernels::cuda {

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define ZP_MMA_ARCH_OK 1
#endif

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// 16 bytes global -> shared, asynchronously; zero-filled (nothing read) when !valid.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
#ifdef ZP_MMA_ARCH_OK
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef ZP_MMA_ARCH_OK
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Wait until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef ZP_MMA_ARCH_OK
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Double buffering: issue the loads of the next tile (when there is one) and wait until the
// current tile, committed one round earlier, has landed in shared memory for every thread.
template <class LoadNext>
__device__ __forceinline__ void next_tile_async(bool has_next, LoadNext&& load_next) {
  if (has_next) {
    load_next();
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}
__device__ __forceinline__ void ldsm_x2_t(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_u32(p))
               : "memory");
}

// c += a (16x16, row-major fragment) * b (16x8, column-major fragment b0, b1), fp32 accumulators.
template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                         uint32_t b1) {
#ifdef ZP_MMA_ARCH_OK
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef ZP_MMA_ARCH_OK
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Two floats as one register of two 16-bit values (lo in the low half, as the fragments want).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// 2^x on the SFU; 2^-inf = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The A fragment of a 16x16 tile from accumulators of its two 16x8 halves (c0: columns 0-7, c1: 8-15).
template <class T>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack2<T>(c0[0], c0[1]);
  a[1] = pack2<T>(c0[2], c0[3]);
  a[2] = pack2<T>(c1[0], c1[1]);
  a[3] = pack2<T>(c1[2], c1[3]);
}

// Where lane `lane` points ldmatrix.x4 within a 16x16 block of a row-major [row][col] tile:
//  - "A" pattern (row = lane%8 + 8*(lane/8%2), col = 8*(lane/16)): the A operand read as stored, and
//    the B operand of a product whose k index runs along the stored rows (read with .trans);
//  - "B" pattern (row = lane%8 + 8*(lane/16), col = 8*(lane/8%2)): the B operand of a product whose k
//    index runs along the stored columns (registers 0,1 = n-tile 0, registers 2,3 = n-tile 1), and the
//    A operand of the transposed stored tile (read with .trans).
struct LaneOffsets {
  int a_row, a_col, b_row, b_col;
  __device__ explicit LaneOffsets(int lane)
      : a_row((lane & 7) + ((lane >> 3) & 1) * 8), a_col((lane >> 4) * 8),
        b_row((lane & 7) + (lane >> 4) * 8), b_col(((lane >> 3) & 1) * 8) {}
};

}  // namespace zp::kernels::cuda
