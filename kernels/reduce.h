// Reductions over many tensors at once (gradient clipping, overflow detection).
#pragma once
#include "kernels/kernel.h"

namespace zp::kernels {

// *out = sum over all tensors of sum(x^2), accumulated in fp32 partials and a double total.
// ptrs[i] (count entries, host array of device pointers on CUDA) holds sizes[i] elements of dt.
// out is a device scalar on CUDA, a host scalar on the CPU. Any inf/nan element makes the result
// inf/nan, so one call serves both clipping and fp16 overflow detection. Deterministic on CUDA
// (fixed partial layout, no atomics).
ZP_KERNEL(void l2norm_squared(StreamHandle s, DType dt, float* out, const void* const* ptrs, const int64_t* sizes,
                              int count))

}  // namespace zp::kernels
