#include "nn/paged_kv_cache.h"

namespace zp::nn {

int64_t PagedKvCache::bytes_for(int64_t layers, int64_t blocks, int64_t block_size, int64_t Hkv, int64_t D,
                                DType dt) {
  return 2 * layers * blocks * block_size * Hkv * D * int64_t(dtype_size(dt));
}

PagedKvCache::PagedKvCache(int64_t layers, int64_t num_blocks, int64_t block_size, int64_t Hkv, int64_t D, DType dt,
                           Device dev, StreamHandle s)
    : num_blocks_(num_blocks), block_size_(block_size), bytes_per_token_(bytes_for(layers, 1, 1, Hkv, D, dt)) {
  ZP_CHECK(layers > 0 && num_blocks > 0 && block_size > 0 && Hkv > 0 && D > 0, "PagedKvCache: bad sizes");
  // Zeros: a slot read before it is written (never, by the kernels' contract) gives finite values.
  for (int64_t l = 0; l < layers; ++l) {
    k_.push_back(Tensor::zeros({num_blocks, block_size, Hkv, D}, dt, dev, "kv_cache", s));
    v_.push_back(Tensor::zeros({num_blocks, block_size, Hkv, D}, dt, dev, "kv_cache", s));
  }
}

}  // namespace zp::nn
