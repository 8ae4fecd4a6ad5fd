// Benchmark weights: every block's compute buffer filled by tiling one block of Normal(0, 0.02)
// values. Weight values do not change kernel timings, and the engine's counter-based initialisation
// of billions of values on the host would dominate a benchmark's run time.
#pragma once
#include <algorithm>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "kernels/elementwise.h"
#include "nn/parameter.h"

namespace zp::bench {

inline void fill_blocks_random(const std::vector<nn::ParamBlock*>& blocks, Device dev, StreamHandle s) {
  const int64_t tile = 1 << 22;
  std::mt19937 g(1);
  std::normal_distribution<float> d(0.f, 0.02f);
  Tensor h = Tensor::empty({tile}, DType::F32, Device::cpu());
  for (int64_t i = 0; i < tile; ++i) h.data<float>()[i] = d(g);
  Tensor f = h.to(dev, s);
  for (nn::ParamBlock* blk : blocks) {
    Tensor b = Tensor::empty({tile}, blk->dtype(), dev, "bench", s);
    kernels::cuda::cast(s, blk->dtype(), b.data(), DType::F32, f.data(), tile);
    for (int64_t o = 0; o < blk->padded(); o += tile) {
      const int64_t n = std::min(tile, blk->padded() - o);
      blk->values().flat(o, n).copy_from(b.flat(0, n), s);
    }
  }
}

}  // namespace zp::bench
