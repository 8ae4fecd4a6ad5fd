// Paged attention, one (query row, query head) at a time, in double: every visible key is found
// through the block table, then scores, softmax and weighted sum as in kernels/cpu/attention.cpp.
// A slot is block * block_size + row, so the cache row of a slot is simply slot * Hkv * D: the block
// structure only matters when turning a position into a slot.
#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "kernels/paged_attention.h"

namespace zp::kernels::cpu {

void kv_cache_write(StreamHandle, DType dt, void* k_cache, void* v_cache, const void* k, const void* v, int64_t N,
                    int64_t Hkv, int64_t D, int64_t k_stride, int64_t v_stride, const int32_t* slots,
                    int64_t block_size) {
  ZP_CHECK(N >= 0 && Hkv > 0 && D > 0 && block_size > 0);
  const int64_t W = Hkv * D, ks = k_stride ? k_stride : W, vs = v_stride ? v_stride : W;
  ZP_CHECK(ks >= W && vs >= W, "kv_cache_write: row stride too small");
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    for (int64_t n = 0; n < N; ++n) {
      if (slots[n] < 0) continue;  // padding token: nothing to keep
      const T* kn = static_cast<const T*>(k) + n * ks;
      const T* vn = static_cast<const T*>(v) + n * vs;
      std::copy(kn, kn + W, static_cast<T*>(k_cache) + int64_t(slots[n]) * W);
      std::copy(vn, vn + W, static_cast<T*>(v_cache) + int64_t(slots[n]) * W);
    }
  });
}

void paged_attention_forward(StreamHandle, DType dt, void* out, const void* q, const void* k_cache,
                             const void* v_cache, const int32_t* block_tables, int64_t max_blocks,
                             const int32_t* context_lens, const int32_t* query_starts, int64_t num_seqs,
                             int64_t num_tokens, int64_t max_context_len, int64_t Hq, int64_t Hkv, int64_t D,
                             int64_t block_size, int64_t q_stride, int64_t o_stride, float scale) {
  ZP_CHECK(num_seqs >= 0 && num_tokens >= 0 && Hq > 0 && Hkv > 0 && D > 0 && max_blocks >= 0);
  ZP_CHECK(Hq % Hkv == 0, "Hq ", Hq, " is not a multiple of Hkv ", Hkv);
  ZP_CHECK(block_size > 0 && std::has_single_bit(uint64_t(block_size)), "block_size ", block_size,
           " is not a power of two");
  const int64_t qs = q_stride ? q_stride : Hq * D, os = o_stride ? o_stride : Hq * D, group = Hq / Hkv;
  ZP_CHECK(qs >= Hq * D && os >= Hq * D, "paged_attention_forward: row stride too small");
  ZP_CHECK(query_starts[0] == 0 && query_starts[num_seqs] == num_tokens, "query_starts must run from 0 to ",
           num_tokens);
  ZP_DISPATCH_FLOAT(dt, T, [&] {
    auto* pq = static_cast<const T*>(q);
    auto* pk = static_cast<const T*>(k_cache);
    auto* pv = static_cast<const T*>(v_cache);
    auto* po = static_cast<T*>(out);
    std::vector<double> p, acc(static_cast<size_t>(D));
    for (int64_t s = 0; s < num_seqs; ++s) {
      const int64_t ctx = context_lens[s], n_s = query_starts[s + 1] - query_starts[s];
      ZP_CHECK(n_s >= 1 && n_s <= ctx, "sequence ", s, ": ", n_s, " query rows for a context of ", ctx);
      ZP_CHECK(ctx <= max_context_len && ctx <= max_blocks * block_size, "sequence ", s, ": context ", ctx,
               " exceeds max_context_len ", max_context_len, " or its block table");
      const int32_t* bt = block_tables + s * max_blocks;
      auto cache_row = [&](int64_t pos, int64_t hk) {
        return (int64_t(bt[pos / block_size]) * block_size + pos % block_size) * Hkv * D + hk * D;
      };
      p.resize(size_t(ctx));
      for (int64_t i = 0; i < n_s; ++i) {
        const int64_t t = query_starts[s] + i, n_vis = ctx - n_s + i + 1;
        for (int64_t h = 0; h < Hq; ++h) {
          const int64_t hk = h / group;
          const T* qi = pq + t * qs + h * D;
          double mx = -INFINITY;
          for (int64_t j = 0; j < n_vis; ++j) {
            const T* kj = pk + cache_row(j, hk);
            double dot = 0;
            for (int64_t d = 0; d < D; ++d) dot += double(qi[d]) * double(kj[d]);
            p[size_t(j)] = double(scale) * dot;
            mx = std::max(mx, p[size_t(j)]);
          }
          double sum = 0;
          for (int64_t j = 0; j < n_vis; ++j) sum += p[size_t(j)] = std::exp(p[size_t(j)] - mx);
          for (int64_t j = 0; j < n_vis; ++j) p[size_t(j)] /= sum;
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int64_t j = 0; j < n_vis; ++j) {
            const T* vj = pv + cache_row(j, hk);
            for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += p[size_t(j)] * double(vj[d]);
          }
          for (int64_t d = 0; d < D; ++d) po[t * os + h * D + d] = T(acc[size_t(d)]);
        }
      }
    }
  });
}

}  // namespace zp::kernels::cpu
