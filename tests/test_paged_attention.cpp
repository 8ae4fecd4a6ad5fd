// Paged attention: the CPU reference against the contiguous attention reference (kernels/attention.h)
// on the same data, with the cache filled by cpu::kv_cache_write from a packed projection; the CUDA
// kernels against the CPU reference.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kernels/attention.h"
#include "kernels/paged_attention.h"
#include "kernels/rope.h"
#include "test_util.h"

namespace zp::test {
using namespace zp::kernels;

struct PagedCase {
  int64_t Hq, Hkv, D, block_size;
  std::vector<int32_t> ctx, n_q;  // per sequence: context length, query rows (the newest tokens)
};

std::ostream& operator<<(std::ostream& o, const PagedCase& c) {
  o << "Hq " << c.Hq << " Hkv " << c.Hkv << " D " << c.D << " block " << c.block_size << " seqs " << c.ctx.size();
  return o;
}

// One call's data. Every context token's k and v sit in a packed row [k | v | pad] of kv (stride kvs),
// sequence after sequence; between sequences sits one row with slot -1 (a padding token). Blocks are
// handed out in a shuffled order, plus a few never used, so block tables are scattered.
struct PagedProblem {
  PagedCase c;
  int64_t num_seqs, num_tokens, max_blocks, num_blocks, max_ctx, qs, os, kvs, rows;
  std::vector<int32_t> qstart, bt, slots;
  std::vector<int64_t> row0;  // first kv row of each sequence
  std::vector<float> q, kv;

  PagedProblem(const PagedCase& pc, uint64_t seed) : c(pc) {
    num_seqs = int64_t(c.ctx.size());
    qstart.assign(1, 0);
    max_blocks = 0;
    max_ctx = 0;
    int64_t used = 0;
    for (int64_t s = 0; s < num_seqs; ++s) {
      qstart.push_back(qstart.back() + c.n_q[size_t(s)]);
      int64_t nb = (c.ctx[size_t(s)] + c.block_size - 1) / c.block_size;
      max_blocks = std::max(max_blocks, nb);
      max_ctx = std::max<int64_t>(max_ctx, c.ctx[size_t(s)]);
      used += nb;
    }
    num_tokens = qstart.back();
    num_blocks = used + 3;
    std::vector<int32_t> perm(static_cast<size_t>(num_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937_64(seed));
    bt.assign(size_t(num_seqs * max_blocks), -1);
    size_t next = 0;
    for (int64_t s = 0; s < num_seqs; ++s)
      for (int64_t j = 0; j * c.block_size < c.ctx[size_t(s)]; ++j) bt[size_t(s * max_blocks + j)] = perm[next++];

    qs = c.Hq * c.D + 8;  // row padding: strides are honoured
    os = c.Hq * c.D + 4;
    kvs = 2 * c.Hkv * c.D + 8;
    for (int64_t s = 0; s < num_seqs; ++s) {
      row0.push_back(int64_t(slots.size()));
      for (int64_t p = 0; p < c.ctx[size_t(s)]; ++p)
        slots.push_back(bt[size_t(s * max_blocks + p / c.block_size)] * int32_t(c.block_size) +
                        int32_t(p % c.block_size));
      slots.push_back(-1);
    }
    rows = int64_t(slots.size());
    q = randn(size_t(num_tokens * qs), seed + 1);
    kv = randn(size_t(rows * kvs), seed + 2);
  }
  int64_t cache_size() const { return num_blocks * c.block_size * c.Hkv * c.D; }
  float scale() const { return attention_default_scale(c.D) * 1.3f; }
};

template <class T> std::vector<T> as(const std::vector<float>& v) { return std::vector<T>(v.begin(), v.end()); }

// What the cache holds before the write: exact in every dtype, and never a random value.
constexpr float kUntouched = 1280.f;

// Elements that differ (a count, not the vectors: the caches hold millions).
size_t mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

// CPU: cache filled by kv_cache_write, paged attention against attention_forward per sequence.
template <class T>
void check_cpu_against_contiguous(const PagedCase& pc, DType dt, double tol) {
  SCOPED_TRACE(::testing::PrintToString(pc) + " " + std::string(dtype_name(dt)));
  PagedProblem P(pc, uint64_t(pc.D * 131 + pc.ctx.size()));
  const PagedCase& c = P.c;
  auto q = as<T>(P.q), kv = as<T>(P.kv);
  std::vector<T> kc(size_t(P.cache_size()), T(kUntouched)), vc(kc);
  cpu::kv_cache_write(nullptr, dt, kc.data(), vc.data(), kv.data(), kv.data() + c.Hkv * c.D, P.rows, c.Hkv, c.D,
                      P.kvs, P.kvs, P.slots.data(), c.block_size);
  // Exactly the slots of real tokens changed; a padding row (slot -1) went nowhere.
  int64_t changed = 0;
  for (size_t i = 0; i < kc.size(); ++i) changed += (kc[i] != T(kUntouched)) + (vc[i] != T(kUntouched));
  int64_t tokens = 0;
  for (int32_t n : c.ctx) tokens += n;
  EXPECT_EQ(changed, 2 * tokens * c.Hkv * c.D);
  for (size_t i = 0; i < P.slots.size(); ++i) {
    if (P.slots[i] < 0) continue;
    for (int64_t e = 0; e < c.Hkv * c.D; ++e) {
      ASSERT_EQ(kc[size_t(P.slots[i] * c.Hkv * c.D + e)], kv[i * size_t(P.kvs) + size_t(e)]);
      ASSERT_EQ(vc[size_t(P.slots[i] * c.Hkv * c.D + e)], kv[i * size_t(P.kvs) + size_t(c.Hkv * c.D + e)]);
    }
  }

  std::vector<T> out(size_t(P.num_tokens * P.os), T(0)), want(out);
  cpu::paged_attention_forward(nullptr, dt, out.data(), q.data(), kc.data(), vc.data(), P.bt.data(), P.max_blocks,
                               c.ctx.data(), P.qstart.data(), P.num_seqs, P.num_tokens, P.max_ctx, c.Hq, c.Hkv,
                               c.D, c.block_size, P.qs, P.os, P.scale());
  for (int64_t s = 0; s < P.num_seqs; ++s) {
    const int64_t n = c.n_q[size_t(s)], t0 = P.qstart[size_t(s)];
    std::vector<float> lse(size_t(c.Hq * n));
    const T* k = kv.data() + P.row0[size_t(s)] * P.kvs;
    cpu::attention_forward(nullptr, dt, want.data() + t0 * P.os, lse.data(), q.data() + t0 * P.qs, k,
                           k + c.Hkv * c.D, 1, n, c.ctx[size_t(s)], c.Hq, c.Hkv, c.D, P.qs, P.kvs, P.kvs, P.os,
                           P.scale(), true);
  }
  EXPECT_LE(rel_error(out, want), tol);
  // Row padding of out was never written.
  for (int64_t t = 0; t < P.num_tokens; ++t) EXPECT_EQ(out[size_t(t * P.os + c.Hq * c.D)], T(0));
}

const std::vector<PagedCase>& cpu_cases() {
  static const std::vector<PagedCase> cases = {
      {8, 2, 16, 4, {1, 5, 17, 40}, {1, 1, 1, 1}},    // GQA decode, ragged, small blocks
      {8, 2, 16, 16, {1, 5, 17, 40}, {1, 1, 1, 1}},   // the same in blocks of 16
      {4, 4, 12, 4, {1, 5, 17, 40}, {1, 3, 1, 40}},   // MHA, prefill chunks mixed with decode rows
      {8, 2, 8, 16, {40, 17, 5, 1}, {7, 17, 2, 1}},   // GQA, mixed, a whole prompt as one chunk
      {6, 1, 10, 8, {33}, {5}},                       // MQA
  };
  return cases;
}

TEST(PagedAttention, CpuMatchesContiguousF64) {
  for (const PagedCase& c : cpu_cases()) check_cpu_against_contiguous<double>(c, DType::F64, 1e-12);
}

TEST(PagedAttention, CpuMatchesContiguousF32) {
  for (const PagedCase& c : cpu_cases()) check_cpu_against_contiguous<float>(c, DType::F32, 1e-5);
}

TEST(PagedAttention, CpuRejectsBadShapes) {
  std::vector<float> q(8), kc(64), out(8);
  std::vector<int32_t> bt = {0}, ctx = {2}, qstart = {0, 1};
  auto call = [&](int64_t Hq, int64_t Hkv, int64_t block_size, int32_t n_ctx) {
    ctx[0] = n_ctx;
    cpu::paged_attention_forward(nullptr, DType::F32, out.data(), q.data(), kc.data(), kc.data(), bt.data(), 1,
                                 ctx.data(), qstart.data(), 1, 1, 4, Hq, Hkv, 2, block_size, 0, 0, 1.f);
  };
  EXPECT_DEATH(call(3, 2, 4, 2), "not a multiple of Hkv");
  EXPECT_DEATH(call(2, 1, 3, 2), "not a power of two");
  EXPECT_DEATH(call(2, 1, 4, 5), "exceeds max_context_len");
}

// --- CUDA against the CPU reference --------------------------------------------------------------

struct GpuData {
  Tensor q, kv, kc, vc, bt, ctx, qstart, slots;
};

GpuData upload_problem(const PagedProblem& P, DType dt) {
  auto ints = [](const std::vector<int32_t>& v) {
    return upload(std::vector<float>(v.begin(), v.end()), DType::I32);
  };
  GpuData g;
  g.q = upload(P.q, dt);
  g.kv = upload(P.kv, dt);
  g.kc = upload(std::vector<float>(size_t(P.cache_size()), kUntouched), dt);
  g.vc = upload(std::vector<float>(size_t(P.cache_size()), kUntouched), dt);
  g.bt = ints(P.bt);
  g.ctx = ints(P.c.ctx);
  g.qstart = ints(P.qstart);
  g.slots = ints(P.slots);
  return g;
}

void check_gpu_against_cpu(const PagedCase& pc, DType dt, uint64_t seed) {
  SCOPED_TRACE(::testing::PrintToString(pc) + " " + std::string(dtype_name(dt)));
  PagedProblem P(pc, seed);
  const PagedCase& c = P.c;
  auto q = round_to(P.q, dt), kv = round_to(P.kv, dt);
  std::vector<float> kc(size_t(P.cache_size()), kUntouched), vc(kc);
  cpu::kv_cache_write(nullptr, DType::F32, kc.data(), vc.data(), kv.data(), kv.data() + c.Hkv * c.D, P.rows, c.Hkv,
                      c.D, P.kvs, P.kvs, P.slots.data(), c.block_size);
  std::vector<float> want(size_t(P.num_tokens * P.os), 0.f);
  cpu::paged_attention_forward(nullptr, DType::F32, want.data(), q.data(), kc.data(), vc.data(), P.bt.data(),
                               P.max_blocks, c.ctx.data(), P.qstart.data(), P.num_seqs, P.num_tokens, P.max_ctx,
                               c.Hq, c.Hkv, c.D, c.block_size, P.qs, P.os, P.scale());

  GpuData g = upload_problem(P, dt);
  const char* kv0 = static_cast<const char*>(g.kv.data());
  cuda::kv_cache_write(nullptr, dt, g.kc.data(), g.vc.data(), kv0, kv0 + c.Hkv * c.D * dtype_size(dt), P.rows,
                       c.Hkv, c.D, P.kvs, P.kvs, g.slots.data<int32_t>(), c.block_size);
  EXPECT_EQ(mismatches(download(g.kc), kc), 0u) << "k cache";
  EXPECT_EQ(mismatches(download(g.vc), vc), 0u) << "v cache";

  Tensor g_out = Tensor::zeros({P.num_tokens * P.os}, dt, Device::cuda());
  cuda::paged_attention_forward(nullptr, dt, g_out.data(), g.q.data(), g.kc.data(), g.vc.data(),
                                g.bt.data<int32_t>(), P.max_blocks, g.ctx.data<int32_t>(), g.qstart.data<int32_t>(),
                                P.num_seqs, P.num_tokens, P.max_ctx, c.Hq, c.Hkv, c.D, c.block_size, P.qs, P.os,
                                P.scale());
  auto out = download(g_out);
  EXPECT_LE(rel_error(out, want), tolerance(dt)) << "out";
  for (int64_t t = 0; t < P.num_tokens; ++t) ASSERT_EQ(out[size_t(t * P.os + c.Hq * c.D)], 0.f) << "row padding";
}

std::vector<int32_t> random_lengths(size_t n, int32_t lo, int32_t hi, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int32_t> d(lo, hi);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// Decode: one long sequence (the context is split over many thread blocks and combined) and a batch of
// 64 ragged ones (enough (row, kv head) pairs to fill the GPU: no split).
TEST(PagedAttentionGpu, DecodeMatchesCpu) {
  ZP_SKIP_WITHOUT_GPU();
  const std::vector<int32_t> ragged = random_lengths(64, 1, 700, 7);
  const std::vector<PagedCase> cases = {
      {8, 2, 128, 16, {3000}, {1}},              // GQA, long context: split
      {4, 4, 64, 16, {3000}, {1}},               // MHA, long context: split
      {32, 8, 128, 16, ragged, std::vector<int32_t>(64, 1)},  // Llama-3-8B heads, batch 64
      {8, 8, 64, 16, ragged, std::vector<int32_t>(64, 1)},    // MHA, batch 64
      {8, 1, 64, 16, {1, 2, 15, 16, 17, 500}, {1, 1, 1, 1, 1, 1}},  // MQA, block edges
      {32, 8, 64, 16, {250}, {1}},  // Llama-3.2-1B heads, batch 1: two partitions, partial chunks
      {32, 8, 64, 16, {97}, {1}},   // one partition, its warps' chunks cut short or empty
  };
  for (const PagedCase& c : cases)
    for (DType dt : gpu_float_dtypes()) check_gpu_against_cpu(c, dt, uint64_t(c.D + c.Hq));
}

// Prefill chunks (n_s > 1) mixed with decode rows, more than 8 query heads per kv head (two head
// groups), head dims 80, 96 and 256, a head dim without 16-byte rows (36: the scalar path), and
// block sizes other than 16. Few rows take the few-rows kernel (head dims 64, 128, 256) or the GQA
// kernel with fewer heads a block; 160 rows of a group of 8 take it with 8.
TEST(PagedAttentionGpu, MixedMatchesCpu) {
  ZP_SKIP_WITHOUT_GPU();
  const std::vector<int32_t> many = random_lengths(160, 1, 300, 11);
  const std::vector<PagedCase> cases = {
      {16, 2, 128, 16, many, std::vector<int32_t>(160, 1)},  // enough rows for 8 heads a block
      {16, 2, 128, 16, {50, 300, 700, 3, 1200}, {1, 7, 40, 3, 1}},
      {8, 8, 64, 16, {50, 300, 700, 3}, {1, 7, 40, 3}},
      {12, 1, 80, 16, {900, 33}, {20, 1}},
      {6, 2, 96, 8, {129, 2000}, {2, 1}},
      {4, 2, 256, 32, {640, 10}, {3, 10}},
      {4, 2, 36, 16, {640, 10, 5}, {1, 4, 1}},
  };
  for (const PagedCase& c : cases)
    for (DType dt : gpu_float_dtypes()) check_gpu_against_cpu(c, dt, uint64_t(c.D * 3 + c.Hq));
}

// kv_cache_write alone on rows that cannot move as 16-byte packs (odd width and stride): still exact.
TEST(PagedAttentionGpu, CacheWriteUnalignedMatchesCpu) {
  ZP_SKIP_WITHOUT_GPU();
  PagedProblem P({3, 3, 5, 4, {9, 2}, {1, 1}}, 3);
  for (DType dt : gpu_float_dtypes()) {
    auto kv = round_to(P.kv, dt);
    const int64_t W = P.c.Hkv * P.c.D, stride = W + 1;  // k and v as two strided views of one buffer
    std::vector<float> kc(size_t(P.cache_size()), kUntouched), vc(kc);
    cpu::kv_cache_write(nullptr, DType::F32, kc.data(), vc.data(), kv.data(), kv.data() + 1, P.rows, P.c.Hkv, P.c.D,
                        stride, stride, P.slots.data(), P.c.block_size);
    GpuData g = upload_problem(P, dt);
    const char* kv0 = static_cast<const char*>(g.kv.data());
    cuda::kv_cache_write(nullptr, dt, g.kc.data(), g.vc.data(), kv0, kv0 + dtype_size(dt), P.rows, P.c.Hkv, P.c.D,
                         stride, stride, g.slots.data<int32_t>(), P.c.block_size);
    EXPECT_EQ(mismatches(download(g.kc), kc), 0u) << dtype_name(dt);
    EXPECT_EQ(mismatches(download(g.vc), vc), 0u) << dtype_name(dt);
  }
}

// rope_kv_cache_write gives on a GPU, bit for bit, what its two kernels give there (rope_forward in
// place, then kv_cache_write), and what the CPU reference gives within the dtype's tolerance. Rows
// with slot -1 (padding tokens) are rotated but not stored; Hq > Hkv (GQA) and a padded row width.
TEST(PagedAttentionGpu, RopeAndCacheWriteInOneKernelEqualsTheTwo) {
  ZP_SKIP_WITHOUT_GPU();
  PagedProblem P({6, 2, 64, 16, {40, 7, 19}, {1, 1, 1}}, 11);
  const int64_t Hq = P.c.Hq, Hkv = P.c.Hkv, D = P.c.D, W = (Hq + 2 * Hkv) * D + 8, N = P.rows;
  const float theta = 500000.f;
  std::vector<float> positions_f(static_cast<size_t>(N));
  std::vector<int32_t> positions(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    positions[size_t(n)] = int32_t((n * 977) % 5000);
    positions_f[size_t(n)] = float(positions[size_t(n)]);
  }
  for (DType dt : gpu_float_dtypes()) {
    SCOPED_TRACE(dtype_name(dt));
    const std::vector<float> qkv = round_to(randn(size_t(N * W), 12, 2.f), dt);
    std::vector<float> want = qkv, kc(size_t(P.cache_size()), kUntouched), vc(kc);
    cpu::rope_kv_cache_write(nullptr, DType::F32, want.data(), N, Hq, Hkv, D, W, theta, positions.data(), kc.data(),
                             vc.data(), P.slots.data(), P.c.block_size);
    want = round_to(want, dt);
    GpuData g = upload_problem(P, dt);
    const Tensor pos = upload(positions_f, DType::I32);
    Tensor fused = upload(qkv, dt), two = upload(qkv, dt);
    Tensor kc2 = upload(std::vector<float>(size_t(P.cache_size()), kUntouched), dt), vc2 = upload(download(kc2), dt);
    cuda::rope_kv_cache_write(nullptr, dt, fused.data(), N, Hq, Hkv, D, W, theta, pos.data<int32_t>(), g.kc.data(),
                              g.vc.data(), g.slots.data<int32_t>(), P.c.block_size);
    char* base = static_cast<char*>(two.data());
    const size_t esz = dtype_size(dt);
    cuda::rope_forward(nullptr, dt, base, base, 1, N, Hq + Hkv, D, theta, 0, W, pos.data<int32_t>());
    cuda::kv_cache_write(nullptr, dt, kc2.data(), vc2.data(), base + size_t(Hq * D) * esz,
                         base + size_t((Hq + Hkv) * D) * esz, N, Hkv, D, W, W, g.slots.data<int32_t>(),
                         P.c.block_size);
    EXPECT_EQ(mismatches(download(fused), download(two)), 0u) << "rotated rows";
    EXPECT_EQ(mismatches(download(g.kc), download(kc2)), 0u) << "k cache";
    EXPECT_EQ(mismatches(download(g.vc), download(vc2)), 0u) << "v cache";
    EXPECT_EQ(mismatches(download(g.vc), vc), 0u) << "v cache against the CPU";
    EXPECT_LE(rel_error(download(fused), want), tolerance(dt)) << "rotated rows against the CPU";
    EXPECT_LE(rel_error(download(g.kc), kc), tolerance(dt)) << "k cache against the CPU";
    EXPECT_GT(rel_error(download(fused), qkv), 0.1) << "the rotation changed the rows";
  }
}

}  // namespace zp::test
