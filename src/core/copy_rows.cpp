#include "core/copy_rows.h"

#include "core/tensor.h"

namespace zp {

void copy_rows(void* dst, size_t dst_stride, Device dst_dev, const void* src, size_t src_stride, Device src_dev,
               size_t row_bytes, int64_t rows, StreamHandle s) {
  ZP_CHECK(rows >= 0 && row_bytes <= dst_stride && row_bytes <= src_stride, "copy_rows: ", rows, " rows of ",
           row_bytes, " bytes with strides ", dst_stride, " and ", src_stride);
  char* d = static_cast<char*>(dst);
  const char* p = static_cast<const char*>(src);
  for (int64_t r = 0; r < rows; ++r)
    copy_bytes(d + size_t(r) * dst_stride, dst_dev, p + size_t(r) * src_stride, src_dev, row_bytes, s);
}

}  // namespace zp
