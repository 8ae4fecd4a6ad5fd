// The keys and values a language model keeps while it generates (issue 13): per layer, one pool of
// fixed-size blocks of tokens in the compute dtype, shared by every sequence in flight; which blocks
// a sequence owns is its block table (kernels/paged_attention.h has the layout). A sequence that
// grows takes one more block and nothing moves, so sequences of any lengths share one pool without
// fragmentation. The pool is the caller's, like a forward's activations: the model reads and writes
// it through CachedBatch, which the runtime's scheduler fills for each step.
#pragma once
#include <vector>

#include "core/tensor.h"

namespace zp::nn {

// One block's keys and values moved between the device pool and the host swap space.
struct BlockCopy {
  int32_t device = 0, host = 0;  // block ids in the pool and in the swap space
};

class PagedKvCache {
 public:
  PagedKvCache() = default;
  // Zero-filled pools [num_blocks, block_size, Hkv, D] of keys and of values for each of `layers`.
  // `host_blocks`: swap space in host memory (pinned for a GPU pool) for the blocks of preempted
  // sequences.
  PagedKvCache(int64_t layers, int64_t num_blocks, int64_t block_size, int64_t Hkv, int64_t D, DType dt, Device dev,
               StreamHandle s = nullptr, int64_t host_blocks = 0);
  int64_t layers() const { return int64_t(k_.size()); }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  void* k(int64_t layer) const { return k_[size_t(layer)].data(); }
  void* v(int64_t layer) const { return v_[size_t(layer)].data(); }
  int64_t host_blocks() const { return host_blocks_; }
  // Enqueues on `s` the copies of every layer's keys and values: `out` from the pool to the swap
  // space, then `in` back (a block's copies in a step are ordered before the step's forward writes).
  void swap(const std::vector<BlockCopy>& out, const std::vector<BlockCopy>& in, StreamHandle s);
  // Bytes one token takes over every layer (keys and values).
  int64_t bytes_per_token() const { return bytes_per_token_; }
  // What a pool of `blocks` blocks costs: bytes_per_token * block_size * blocks.
  static int64_t bytes_for(int64_t layers, int64_t blocks, int64_t block_size, int64_t Hkv, int64_t D, DType dt);

 private:
  int64_t num_blocks_ = 0, block_size_ = 0, bytes_per_token_ = 0, host_blocks_ = 0;
  std::vector<Tensor> k_, v_;
  std::vector<Tensor> k_host_, v_host_;  // [host_blocks, block_size, Hkv, D] per layer
};

// One step of cached inference: the new tokens of several sequences, laid out as
//   [ prefill tokens (sequences whose whole context is new this step) | decode tokens ]
// Every pointer is a device int32 array on the cache's device. The prefill part runs through the
// flash attention kernels as one packed row with a segment id per sequence; the decode part through
// the paged kernel against the cache. Both parts write their keys and values into the cache first.
struct CachedBatch {
  int64_t num_tokens = 0;          // N, both parts
  int64_t num_prefill_tokens = 0;  // Np: tokens [0, Np)
  const int32_t* positions = nullptr;  // [N] each token's position in its sequence (RoPE, learned positions)
  const int32_t* slots = nullptr;      // [N] the cache slot (block * block_size + row) of each token
  const int32_t* segments = nullptr;   // [Np] which prefill sequence a prefill token belongs to
  // The decode part, tokens [Np, N): paged_attention_forward's arguments (query_starts relative to Np).
  int64_t num_decode_seqs = 0;
  const int32_t* block_tables = nullptr;  // [num_decode_seqs, max_blocks]
  int64_t max_blocks = 0;
  const int32_t* context_lens = nullptr;  // [num_decode_seqs]
  const int32_t* query_starts = nullptr;  // [num_decode_seqs + 1]
  int64_t max_context_len = 0;
  // The rows (in [0, N)) whose logits are wanted, usually each sequence's last token: [num_outputs].
  const int32_t* output_rows = nullptr;
  int64_t num_outputs = 0;
};

}  // namespace zp::nn
