#include "nn/paged_kv_cache.h"

namespace zp::nn {

int64_t PagedKvCache::bytes_for(int64_t layers, int64_t blocks, int64_t block_size, int64_t Hkv, int64_t D,
                                DType dt) {
  return 2 * layers * blocks * block_size * Hkv * D * int64_t(dtype_size(dt));
}

PagedKvCache::PagedKvCache(int64_t layers, int64_t num_blocks, int64_t block_size, int64_t Hkv, int64_t D, DType dt,
                           Device dev, StreamHandle s, int64_t host_blocks)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      bytes_per_token_(bytes_for(layers, 1, 1, Hkv, D, dt)),
      host_blocks_(host_blocks) {
  ZP_CHECK(layers > 0 && num_blocks > 0 && block_size > 0 && Hkv > 0 && D > 0 && host_blocks >= 0,
           "PagedKvCache: bad sizes");
  // Zeros: a slot read before it is written (never, by the kernels' contract) gives finite values.
  for (int64_t l = 0; l < layers; ++l) {
    k_.push_back(Tensor::zeros({num_blocks, block_size, Hkv, D}, dt, dev, "kv_cache", s));
    v_.push_back(Tensor::zeros({num_blocks, block_size, Hkv, D}, dt, dev, "kv_cache", s));
    if (host_blocks > 0) {
      const bool pinned = dev.is_cuda();
      k_host_.push_back(Tensor::empty({host_blocks, block_size, Hkv, D}, dt, Device::cpu(), "kv_swap", nullptr, pinned));
      v_host_.push_back(Tensor::empty({host_blocks, block_size, Hkv, D}, dt, Device::cpu(), "kv_swap", nullptr, pinned));
    }
  }
}

void PagedKvCache::swap(const std::vector<BlockCopy>& out, const std::vector<BlockCopy>& in, StreamHandle s) {
  const size_t block_bytes = size_t(bytes_per_token_ / 2 / layers()) * size_t(block_size_);
  const Device dev = k_[0].device();
  auto copy = [&](const BlockCopy& c, bool to_host) {
    ZP_CHECK(c.device >= 0 && c.device < num_blocks_ && c.host >= 0 && c.host < host_blocks_,
             "KV swap of block ", c.device, " <-> host block ", c.host, " outside the pool (", num_blocks_,
             ") or the swap space (", host_blocks_, ")");
    for (size_t l = 0; l < k_.size(); ++l)
      for (auto [pool, host] : {std::pair{&k_[l], &k_host_[l]}, std::pair{&v_[l], &v_host_[l]}}) {
        char* d = static_cast<char*>(pool->data()) + size_t(c.device) * block_bytes;
        char* h = static_cast<char*>(host->data()) + size_t(c.host) * block_bytes;
        if (to_host)
          copy_bytes_async(h, Device::cpu(), d, dev, block_bytes, s);
        else
          copy_bytes_async(d, dev, h, Device::cpu(), block_bytes, s);
      }
  };
  for (const BlockCopy& c : out) copy(c, true);
  for (const BlockCopy& c : in) copy(c, false);
}

}  // namespace zp::nn
