#include "core/allocator.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/host_ops.h"
#ifdef ZP_WITH_CUDA
#include "core/cuda_check.h"
#endif

namespace zp {

MemoryStats Allocator::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}
void Allocator::reset_peak() {
  std::lock_guard<std::mutex> l(mu_);
  stats_.peak = stats_.current;
  stats_.peak_by_tag = stats_.current_by_tag;
}
void Allocator::note_alloc(size_t bytes, const std::string& tag) {
  std::lock_guard<std::mutex> l(mu_);
  stats_.current += bytes;
  stats_.num_allocs++;
  if (stats_.current > stats_.peak) stats_.peak = stats_.current;
  size_t& t = stats_.current_by_tag[tag];
  t += bytes;
  size_t& pt = stats_.peak_by_tag[tag];
  if (t > pt) pt = t;
}
void Allocator::note_free(size_t bytes, const std::string& tag) {
  std::lock_guard<std::mutex> l(mu_);
  stats_.current -= bytes;
  stats_.current_by_tag[tag] -= bytes;
}

namespace {

class HostAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, const std::string& tag, StreamHandle) override {
    size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded ? rounded : 64);
    ZP_CHECK(p, "host allocation of ", bytes, " bytes failed (tag ", tag, ")");
    note_alloc(bytes, tag);
    return p;
  }
  void deallocate(void* p, size_t bytes, const std::string& tag, StreamHandle) override {
    std::free(p);
    note_free(bytes, tag);
  }
  Device device() const override { return Device::cpu(); }
};

#ifdef ZP_WITH_CUDA
class PinnedHostAllocator final : public Allocator {
 public:
  ~PinnedHostAllocator() override {
    for (auto& [size, blocks] : cache_)
      for (void* p : blocks) cudaFreeHost(p);
  }
  void* allocate(size_t bytes, const std::string& tag, StreamHandle) override {
    size_t key = round(bytes);
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> l(cache_mu_);
      auto it = cache_.find(key);
      if (it != cache_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
      }
    }
    if (!p) {
      // Pinning can fail where allocating would not (RLIMIT_MEMLOCK, a cgroup, fragmentation): a
      // zp::Error, so that a caller with a pageable fallback (the offload stores) can take it.
      const cudaError_t e = cudaHostAlloc(&p, key, cudaHostAllocPortable);
      if (e != cudaSuccess) {
        cudaGetLastError();  // not sticky: clear it
        throw Error(detail::cat("cannot pin ", key, " bytes of host memory for '", tag, "': ", cudaGetErrorString(e)));
      }
    }
    note_alloc(bytes, tag);
    return p;
  }
  void deallocate(void* p, size_t bytes, const std::string& tag, StreamHandle) override {
    std::lock_guard<std::mutex> l(cache_mu_);
    cache_[round(bytes)].push_back(p);
    note_free(bytes, tag);
  }
  Device device() const override { return Device::cpu(); }

 private:
  static size_t round(size_t b) { return b <= 4096 ? 4096 : (b + 65535) / 65536 * 65536; }
  std::mutex cache_mu_;
  std::unordered_map<size_t, std::vector<void*>> cache_;
};

class DeviceAllocator final : public Allocator {
 public:
  explicit DeviceAllocator(int index) : index_(index) {
    ZP_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool_, index));
    uint64_t threshold = UINT64_MAX;  // keep freed memory cached in the pool
    ZP_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold));
  }
  void* allocate(size_t bytes, const std::string& tag, StreamHandle s) override {
    void* p = nullptr;
    if (bytes == 0) bytes = 1;
    int prev = 0;
    ZP_CUDA_CHECK(cudaGetDevice(&prev));
    if (prev != index_) ZP_CUDA_CHECK(cudaSetDevice(index_));
    // ZP_HOST_OPS lets CPU references work on device buffers in place: they must be host-readable.
    cudaError_t e = managed_ ? cudaMallocManaged(&p, bytes) : cudaMallocFromPoolAsync(&p, bytes, pool_, s);
    if (e != cudaSuccess) {
      MemoryStats st = stats();
      ZP_FATAL("out of device memory on cuda:", index_, " allocating ", bytes, " bytes for '", tag,
               "' (", st.current, " bytes in use by the engine, peak ", st.peak, "): ",
               cudaGetErrorString(e));
    }
    if (prev != index_) ZP_CUDA_CHECK(cudaSetDevice(prev));
    note_alloc(bytes, tag);
    return p;
  }
  void deallocate(void* p, size_t bytes, const std::string& tag, StreamHandle s) override {
    if (managed_) {
      ZP_CUDA_CHECK(cudaDeviceSynchronize());  // cudaFree is not stream-ordered: let the users finish
      ZP_CUDA_CHECK(cudaFree(p));
    } else {
      ZP_CUDA_CHECK(cudaFreeAsync(p, s));
    }
    note_free(bytes ? bytes : 1, tag);
  }
  Device device() const override { return Device::cuda(index_); }

 private:
  int index_;
  cudaMemPool_t pool_ = nullptr;
  const bool managed_ = host_ops_enabled();
};
#endif

}  // namespace

Allocator& host_allocator() {
  static HostAllocator a;
  return a;
}

Allocator& pinned_host_allocator() {
#ifdef ZP_WITH_CUDA
  if (cuda_device_count() > 0) {
    static PinnedHostAllocator a;
    return a;
  }
#endif
  return host_allocator();  // no driver: pageable memory is all there is
}

Allocator& device_allocator(int index) {
#ifdef ZP_WITH_CUDA
  static std::mutex mu;
  static std::vector<std::unique_ptr<DeviceAllocator>> allocators;
  std::lock_guard<std::mutex> l(mu);
  int n = cuda_device_count();
  ZP_CHECK(index >= 0 && index < n, "cuda:", index, " requested but ", n, " CUDA devices exist");
  if (allocators.empty()) allocators.resize(size_t(n));
  if (!allocators[size_t(index)]) allocators[size_t(index)] = std::make_unique<DeviceAllocator>(index);
  return *allocators[size_t(index)];
#else
  ZP_FATAL("cuda:", index, " requested in a CPU-only build (ZP_CUDA=OFF)");
#endif
}

namespace {

double proc_status_bytes(const char* key) {  // "VmHWM:", in kB in the file
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(key);
  while (std::getline(in, line))
    if (line.compare(0, n, key) == 0) return std::stod(line.substr(n)) * 1024.0;
  return 0;
}

}  // namespace

double host_peak_rss_bytes() { return proc_status_bytes("VmHWM:"); }
double host_current_rss_bytes() { return proc_status_bytes("VmRSS:"); }

Allocator& allocator_for(Device d, bool pinned) {
  if (d.is_cuda()) return device_allocator(d.index);
  return pinned ? pinned_host_allocator() : host_allocator();
}

}  // namespace zp
