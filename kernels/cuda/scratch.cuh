// Scratch memory for the CUDA kernels: the one way a kernel family gets memory its caller did not
// hand it. Both kinds come from the device's stream-ordered caching allocator (core/allocator.h), so
// they show up in the memory statistics under their tag and cost no cudaMalloc on the hot path.
//  - KernelScratch: lives for one call. It is returned to the allocator on the call's stream when the
//    launcher returns; stream ordering makes that safe while the kernels are still queued (the block
//    is only handed out again to work ordered after them).
//  - stream_workspace: lives for the process, one per (device, stream, tag), for libraries that want
//    the same workspace on every call (cuBLASLt), or zeroed once for counters that kernels leave at
//    zero (the paged attention's fused combine). Two streams never share one, because matmuls on two
//    streams may run at once.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "core/allocator.h"
#include "core/cuda_check.h"

namespace zp::kernels::cuda {

inline int current_device() {
  int dev = 0;
  ZP_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

class KernelScratch {
 public:
  // bytes == 0 allocates nothing (get() is nullptr).
  KernelScratch(StreamHandle s, size_t bytes, const char* tag)
      : alloc_(device_allocator(current_device())), s_(s), bytes_(bytes), tag_(tag),
        ptr_(bytes ? alloc_.allocate(bytes, tag, s) : nullptr) {}
  ~KernelScratch() {
    if (ptr_) alloc_.deallocate(ptr_, bytes_, tag_, s_);
  }
  KernelScratch(KernelScratch&& o) noexcept
      : alloc_(o.alloc_), s_(o.s_), bytes_(o.bytes_), tag_(o.tag_), ptr_(std::exchange(o.ptr_, nullptr)) {}
  KernelScratch(const KernelScratch&) = delete;
  KernelScratch& operator=(const KernelScratch&) = delete;
  KernelScratch& operator=(KernelScratch&&) = delete;

  void* get() const { return ptr_; }
  template <class T> T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  Allocator& alloc_;
  StreamHandle s_;
  size_t bytes_;
  const char* tag_;
  void* ptr_;
};

// `tag` is a string literal (its address is part of the key). Never freed: destroying it from a
// static destructor would race the CUDA runtime's own teardown.
inline void* stream_workspace(StreamHandle s, size_t bytes, const char* tag, bool zeroed = false) {
  static std::mutex mu;
  static auto* spaces = new std::map<std::tuple<int, StreamHandle, const char*>, void*>();
  const int dev = current_device();
  std::lock_guard<std::mutex> lock(mu);
  void*& w = (*spaces)[{dev, s, tag}];
  if (!w) {
    w = device_allocator(dev).allocate(bytes, tag, s);
    if (zeroed) ZP_CUDA_CHECK(cudaMemsetAsync(w, 0, bytes, s));
  }
  return w;
}

// A stream_workspace that starts zeroed, for kernels that keep it so between calls (counters that
// the last block to count resets).
inline void* zeroed_stream_workspace(StreamHandle s, size_t bytes, const char* tag) {
  return stream_workspace(s, bytes, tag, /*zeroed=*/true);
}

}  // namespace zp::kernels::cuda
