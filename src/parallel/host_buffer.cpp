#include "parallel/host_buffer.h"

#include <cstring>

#include "core/log.h"

namespace zp::parallel {

Tensor host_buffer(int64_t n, DType dt, bool& pinned, const char* tag, const char* what) {
  if (pinned) {
    try {
      Tensor t = Tensor::empty({n}, dt, Device::cpu(), tag, nullptr, /*pinned=*/true);
      std::memset(t.data(), 0, t.nbytes());
      return t;
    } catch (const Error& e) {
      ZP_LOG_WARN("cannot pin ", double(n) * double(dtype_size(dt)) / double(1 << 20), " MiB of host memory for ",
                  what, " (", e.what(), "): using pageable memory, whose copies to and from the GPU are slower");
      pinned = false;
    }
  }
  return Tensor::zeros({n}, dt, Device::cpu(), tag);
}

}  // namespace zp::parallel
