// Elementwise ops over flat arrays: dtype casts, scale, add, axpy, fill. n is the element count.
#pragma once
#include "kernels/kernel.h"

namespace zp::kernels {

ZP_KERNEL(void cast(StreamHandle s, DType dst_dt, void* dst, DType src_dt, const void* src, int64_t n))
// y = alpha * x  (in place allowed)
ZP_KERNEL(void scale(StreamHandle s, DType dt, void* y, const void* x, float alpha, int64_t n))
// z = x + y
ZP_KERNEL(void add(StreamHandle s, DType dt, void* z, const void* x, const void* y, int64_t n))
// y += alpha * x
ZP_KERNEL(void axpy(StreamHandle s, DType dt, void* y, float alpha, const void* x, int64_t n))
ZP_KERNEL(void fill(StreamHandle s, DType dt, void* y, float value, int64_t n))

}  // namespace zp::kernels
