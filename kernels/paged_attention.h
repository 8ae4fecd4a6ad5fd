// Attention against a paged KV cache (inference, issue 13): the keys and values of every sequence
// live in fixed-size blocks of a shared pool, found through a per-sequence block table, so a growing
// sequence takes one more block and nothing is ever copied.
//
// Cache layout, per layer: k_cache and v_cache are [num_blocks, block_size, Hkv, D] (dtype dt).
// Position p of a sequence whose block table row is bt[] lives in block bt[p / block_size], row
// p % block_size, i.e. at element ((bt[p / block_size] * block_size + p % block_size) * Hkv + h) * D + d.
// A "slot" is block * block_size + row.
#pragma once
#include "kernels/kernel.h"

namespace zp::kernels {

// Writes N new tokens' keys and values into their slots: row n of k (Hkv*D contiguous elements at
// k + n * k_stride; stride 0 = Hkv*D) goes to slot slots[n] of k_cache, likewise v. slots is int32
// [N] on the device of the cache; a negative slot skips the row. k and v may be views into a packed
// [q | k | v] projection row (the strides are then the row width).
ZP_KERNEL(void kv_cache_write(StreamHandle s, DType dt, void* k_cache, void* v_cache, const void* k, const void* v,
                              int64_t N, int64_t Hkv, int64_t D, int64_t k_stride, int64_t v_stride,
                              const int32_t* slots, int64_t block_size))

// Causal attention of the newest tokens of num_seqs sequences against their caches (which already
// hold those tokens: write them first with kv_cache_write).
//   q[num_tokens, Hq, D] with row stride q_stride (0 = Hq*D); out likewise with o_stride (0 = Hq*D).
//   Sequence s owns query rows query_starts[s] .. query_starts[s+1]-1 (n_s >= 1 of them; int32
//   [num_seqs+1], query_starts[0] = 0, query_starts[num_seqs] = num_tokens); its cache holds
//   context_lens[s] >= n_s tokens (int32 [num_seqs]), in blocks block_tables[s * max_blocks + j]
//   (int32 [num_seqs, max_blocks]). Its i-th query row sits at position context_lens[s] - n_s + i
//   and sees the keys at positions 0 .. that position.
//   Query head h reads kv head h / (Hq / Hkv). out = softmax(scale * q.k) v over the visible keys.
// Every array is on the device the cache is on. num_tokens and max_context_len (>= every
// context_lens[s]) are host values the CUDA launcher sizes its grid with. Decode (n_s = 1 for every
// sequence) is the case the CUDA kernel is built for; it splits long contexts over several thread
// blocks (flash-decoding) and reads each kv head once for all the query heads that share it.
ZP_KERNEL(void paged_attention_forward(StreamHandle s, DType dt, void* out, const void* q, const void* k_cache,
                                       const void* v_cache, const int32_t* block_tables, int64_t max_blocks,
                                       const int32_t* context_lens, const int32_t* query_starts, int64_t num_seqs,
                                       int64_t num_tokens, int64_t max_context_len, int64_t Hq, int64_t Hkv,
                                       int64_t D, int64_t block_size, int64_t q_stride, int64_t o_stride,
                                       float scale))

}  // namespace zp::kernels
