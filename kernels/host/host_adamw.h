// The offload tier's CPU AdamW: kernels/adamw.h's fused multi-tensor step on host memory, with explicit
// AVX-512 and AVX2 paths chosen at run time (the build stays x86-64-v2), a scalar fallback, and a pool
// of threads kept for the object's lifetime. Every path gives the same bits as the reference
// zp::kernels::cpu::adamw_step: the same float operations in the same order, never fused (both files
// build with -ffp-contract=off), and IEEE sqrt and division, which are correctly rounded in every ISA.
#pragma once
#include <mutex>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/host/thread_pool.h"

namespace zp::kernels::host {

enum class Isa { Scalar, Avx2, Avx512 };  // Avx2 also needs F16C (every AVX2 CPU has it)

Isa best_isa();                       // the widest one this CPU (and OS) supports
std::vector<Isa> supported_isas();    // every one it supports, Scalar first
bool isa_supported(Isa isa);
const char* isa_name(Isa isa);        // "scalar", "avx2", "avx512"

// One per engine (it owns threads). step() may be called from any thread, e.g. a worker that updates
// block i while the GPU streams block i + 1; concurrent calls on one object run one after the other.
class HostAdamW {
 public:
  explicit HostAdamW(int threads = 0);  // 0: std::thread::hardware_concurrency()
  int threads() const { return pool_.size(); }
  ThreadPool& pool() { return pool_; }

  // Every pointer is host memory; param_copy (optional per tensor) is written in copy_dt (F32, BF16 or
  // F16, rounded to nearest even). Any alignment and any size.
  void step(const AdamWTensor* tensors, int count, const AdamWConfig& cfg, DType copy_dt, Isa isa = best_isa());

 private:
  struct Chunk {
    int tensor;
    int64_t begin, end;
  };
  ThreadPool pool_;
  std::mutex mutex_;            // guards chunks_ across concurrent step() calls
  std::vector<Chunk> chunks_;   // the current step's work list, kept to avoid an allocation per call
};

namespace detail {

// What one step derives from AdamWConfig, rounded to float exactly as the reference does.
struct Consts {
  float grad_scale, one_minus_beta1, one_minus_w, beta2, one_minus_beta2, neg_step_size, bias_correction2_sqrt,
      eps;
};
Consts consts_of(const AdamWConfig& cfg);

// n contiguous elements of one tensor; copy (may be null) points at element 0 of the range.
struct Range {
  float* p;
  const float* g;
  float* m;
  float* v;
  void* copy;
  int64_t n;
  float decay;
};
void update_scalar(const Range& r, const Consts& k, DType copy_dt);
void update_avx2(const Range& r, const Consts& k, DType copy_dt);
void update_avx512(const Range& r, const Consts& k, DType copy_dt);

}  // namespace detail
}  // namespace zp::kernels::host
