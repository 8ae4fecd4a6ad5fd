// Layout and per-channel ops for channels-last (NHWC) images [N, HW, C]: the batched transpose that
// moves between NCHW and NHWC (a UNet's input and output samples, a checkpoint's weight layouts), and
// the per-sample, per-channel shift a ResBlock adds after its first convolution (its projected time
// embedding) with its backward.
#pragma once
#include "kernels/kernel.h"

namespace zp::kernels {

// y[b, q, p] = x[b, p, q] for each of B matrices x[b] of [P, Q] (out of place): with P = C, Q = HW
// it turns NCHW into NHWC, with P = HW, Q = C back. Its backward is the same op with P and Q swapped.
ZP_KERNEL(void transpose_batched(StreamHandle s, DType dt, void* y, const void* x, int64_t B, int64_t P, int64_t Q))
// y[n, i, c] += shift[n, c] for i < HW  (in place; shift[N, C] in dt)
ZP_KERNEL(void channel_add(StreamHandle s, DType dt, void* y, const void* shift, int64_t N, int64_t C, int64_t HW))
// sum[n, c] = sum over i < HW of x[n, i, c]  (written, dt; the backward of channel_add for the shift)
ZP_KERNEL(void channel_sum(StreamHandle s, DType dt, void* sum, const void* x, int64_t N, int64_t C, int64_t HW))

}  // namespace zp::kernels
