#include "core/copy_rows.h"

#include <cstring>

#include "core/device.h"
#include "core/error.h"

#ifdef ZP_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#endif

namespace zp {

void copy_rows(void* dst, size_t dst_stride, Device dst_dev, const void* src, size_t src_stride, Device src_dev,
               size_t row_bytes, int64_t rows, StreamHandle s) {
  ZP_CHECK(rows >= 0 && row_bytes <= dst_stride && row_bytes <= src_stride, "copy_rows: ", rows, " rows of ",
           row_bytes, " bytes with strides ", dst_stride, " and ", src_stride);
  if (rows == 0 || row_bytes == 0) return;
  char* d = static_cast<char*>(dst);
  const char* p = static_cast<const char*>(src);
  if (dst_dev.is_cpu() && src_dev.is_cpu()) {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(d + size_t(r) * dst_stride, p + size_t(r) * src_stride, row_bytes);
    return;
  }
#ifdef ZP_WITH_CUDA
  // As copy_bytes: a download into pageable memory waits for the stream's earlier work first, bounded.
  const bool download = dst_dev.is_cpu();
  if (download) stream_synchronize(s);
  ZP_CUDA_CHECK(
      cudaMemcpy2DAsync(dst, dst_stride, src, src_stride, row_bytes, size_t(rows), cudaMemcpyDefault, s));
  if (download) stream_synchronize(s);
#else
  ZP_FATAL("device copy in a CPU-only build");
#endif
}

}  // namespace zp
