// Allocators. The device allocator is stream-ordered and caching: it sits on CUDA's memory pool
// (cudaMallocFromPoolAsync) with the release threshold raised so freed blocks stay cached in the pool
// instead of going back to the driver; a block freed on one stream is reusable on that stream at once
// and on others after the free is ordered before them. We only add the bookkeeping the engine wants:
// current and peak bytes, in total and per tag ("params", "grads", "activations", ...).
#pragma once
#include <cstddef>
#include <map>
#include <mutex>
#include <string>

#include "core/device.h"

namespace zp {

struct MemoryStats {
  size_t current = 0, peak = 0, num_allocs = 0;
  std::map<std::string, size_t> current_by_tag, peak_by_tag;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes, const std::string& tag, StreamHandle s) = 0;
  virtual void deallocate(void* p, size_t bytes, const std::string& tag, StreamHandle s) = 0;
  virtual Device device() const = 0;
  MemoryStats stats() const;
  void reset_peak();

 protected:
  void note_alloc(size_t bytes, const std::string& tag);
  void note_free(size_t bytes, const std::string& tag);

 private:
  mutable std::mutex mu_;
  MemoryStats stats_;
};

// Pageable host memory, 64-byte aligned (AVX-512 loads).
Allocator& host_allocator();
// Page-locked host memory for fast async copies; freed blocks are cached by size for reuse.
Allocator& pinned_host_allocator();
// The caching stream-ordered allocator of CUDA device `index`.
Allocator& device_allocator(int index);
// The allocator that owns memory of `d` (pinned=true picks pinned host memory for the CPU).
Allocator& allocator_for(Device d, bool pinned = false);

// The process's peak resident host memory so far (VmHWM) and now (VmRSS), in bytes; 0 where /proc
// is missing.
double host_peak_rss_bytes();
double host_current_rss_bytes();

}  // namespace zp
