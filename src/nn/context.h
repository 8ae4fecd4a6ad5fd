// What every module's forward and backward run with: the device, the stream and the compute dtype,
// and whether a forward keeps anything for a backward.
#pragma once
#include "core/tensor.h"

namespace zp::nn {

// The allocator tag of what a forward keeps for its backward (Ctx::saved).
inline constexpr const char* kSavedTag = "saved";

// Where a forward's dropout masks come from (LoRA's dropout, kernels/dropout.h): a key for this
// forward (0: the forward draws none), the global index of its first sample and how many samples it
// holds. A module's mask rows are numbered by sample: a Linear over N rows (samples x tokens) starts
// at first_sample x N / samples, a Conv2d (one row a sample) at first_sample. So a forward and its
// backward draw the same masks, and a token's mask depends only on its sample's place in the global
// batch, not on the rank, micro-batch or pipeline chunk that runs it.
struct DropoutDraw {
  uint64_t key = 0;
  int64_t first_sample = 0;
  int64_t samples = 1;
  // The global row of the first of a module's `rows` mask rows (a whole number per sample).
  int64_t first_row(int64_t rows) const {
    ZP_CHECK(samples > 0 && rows % samples == 0, "dropout over ", rows, " rows of ", samples, " samples");
    return first_sample * (rows / samples);
  }
};

struct Ctx {
  Device dev;
  StreamHandle s = nullptr;
  DType dt = DType::F32;
  // false for a forward that runs for its output alone (inference): what the modules would keep
  // for the backward is then working memory like any other, gone when each module returns.
  bool saves = true;
  DropoutDraw dropout;

  // Working memory of one forward or backward (tagged so the allocator's statistics show it apart
  // from parameters).
  Tensor act(const Shape& shape) const { return Tensor::empty(shape, dt, dev, "activations", s); }
  Tensor act(const Shape& shape, DType t) const { return Tensor::empty(shape, t, dev, "activations", s); }
  // What a forward keeps for its backward (a module's Saved, a model's activation state), tagged
  // apart from working memory: the allocator's statistics then show what a micro-batch in flight
  // holds, and that an inference forward holds nothing.
  Tensor saved(const Shape& shape) const { return saved(shape, dt); }
  Tensor saved(const Shape& shape, DType t) const {
    return Tensor::empty(shape, t, dev, saves ? kSavedTag : "activations", s);
  }
};

}  // namespace zp::nn
