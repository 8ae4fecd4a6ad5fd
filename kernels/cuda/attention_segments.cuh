// Packed sequences (segments, kernels/attention.h) in both CUDA attention paths, the general kernels
// of attention.cu and the tensor-core ones of flash_attention.cu: the shape rule, and the min/max
// segment-id range of a tile of tokens, reduced over a warp so every lane gets the same answer and a
// tile pair whose ranges do not overlap is skipped uniformly (no shared memory, no barrier).
#pragma once
#include <climits>
#include <cstdint>

#include "core/error.h"

namespace zp::kernels::cuda {

// Segment ids describe one sequence of T tokens whose queries and keys are the same tokens.
inline void check_segments_shape(const int32_t* segments, int64_t Tq, int64_t Tk) {
  ZP_CHECK(!segments || Tq == Tk, "attention segments need Tq == Tk, got Tq ", Tq, " Tk ", Tk);
}

// The ids of a tile lie in [lo, hi]; an empty tile has lo > hi, which overlaps nothing.
struct SegRange {
  int lo, hi;
  // Some id may be in both tiles (no overlap: none is, and the tiles see nothing of each other).
  __device__ bool overlaps(const SegRange& o) const { return lo <= o.hi && o.lo <= hi; }
  // Every token of both ranges has one and the same id: no elementwise segment mask is needed.
  __device__ bool same_single(const SegRange& o) const { return lo == hi && o.lo == o.hi && lo == o.lo; }
};

// The lanes' ranges joined, in every lane.
__device__ __forceinline__ SegRange warp_join(SegRange r) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    r.lo = min(r.lo, __shfl_xor_sync(0xffffffffu, r.lo, o));
    r.hi = max(r.hi, __shfl_xor_sync(0xffffffffu, r.hi, o));
  }
  return r;
}

// A tile of 32 tokens, one id per lane (`valid` false past the end: ignored).
__device__ __forceinline__ SegRange warp_segment_range(int id, bool valid) {
  return warp_join(valid ? SegRange{id, id} : SegRange{INT_MAX, INT_MIN});
}

// Tokens [t0, t0 + N) of one row (`ids` = its T ids; tokens at or past T are ignored), strided over
// the lanes.
template <int N>
__device__ __forceinline__ SegRange warp_segment_range(const int32_t* ids, int t0, int T, int lane) {
  SegRange r{INT_MAX, INT_MIN};
#pragma unroll
  for (int i = lane; i < N; i += 32)
    if (t0 + i < T) {
      const int id = ids[t0 + i];
      r.lo = min(r.lo, id);
      r.hi = max(r.hi, id);
    }
  return warp_join(r);
}

}  // namespace zp::kernels::cuda
