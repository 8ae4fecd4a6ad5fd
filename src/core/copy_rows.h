// Strided row copies: `rows` rows of `row_bytes` each, read `src_stride` bytes apart and written
// `dst_stride` bytes apart, between any two devices. This is what concatenating or splitting
// tensors along an inner dimension comes to (the UNet's skip connections along channels, SDXL's
// text_embeds ++ time embeddings along features): the outer index walks the rows, the inner block
// is contiguous on both sides.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/device.h"

namespace zp {

// Ordered on `s`: one strided 2-D copy (cudaMemcpy2DAsync) where a GPU is involved, since channels-last
// images concatenate along channels as one short row per pixel (tens of thousands of rows), and a
// memcpy per row on the host.
void copy_rows(void* dst, size_t dst_stride, Device dst_dev, const void* src, size_t src_stride, Device src_dev,
               size_t row_bytes, int64_t rows, StreamHandle s);

}  // namespace zp
